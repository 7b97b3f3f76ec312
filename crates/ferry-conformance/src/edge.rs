//! The cases at the edges: odd and long names, a big file, a refused
//! change, reads ahead (re-exported by [`cases`](crate::cases)).

use std::io::ErrorKind;

use ferry_engine::store::{SourceFile, Store, StoreExt};

use crate::cases::{assert_mtime, err_kind, owned, stat_of, unless_unsupported};
use crate::{
    c, file_meta, names, put, put_from, read_all, root, show, Bytes, Fixture, Pattern, T0,
};

// ------------------------------------------------------------------ names

/// Names with spaces, unicode, `%`, `+`, URL and shell specials, a newline,
/// in nested directories too (rclone's awkward path among them): written,
/// listed, stat'ed, read, renamed and removed exactly.
pub fn odd_names<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let odd: &[&str] = &[
        " leading space",
        "trailing space ",
        "two  spaces",
        "\u{fc}n\u{ef}c\u{f8}d\u{e9}",
        "\u{65e5}\u{672c}\u{8a9e}",
        "emoji \u{1f680}",
        "100%",
        "%41%2F",
        "a+b c",
        "q?x=1&y",
        "hash#frag",
        "star*",
        "quote'",
        "dq\"",
        "back\\slash",
        "tab\there",
        "new\nline",
        "colon:semi;",
        "<angle>",
        "~tilde",
        ".hidden",
        "..dots",
        "-dash",
        "@at$dollar`tick`|pipe",
        "[br]{cb}(p)",
        "e\u{301} combining",
    ];
    for n in odd {
        put(s, &r, n.as_bytes(), n.as_bytes()).unwrap_or_else(|e| panic!("put {n:?}: {e}"));
    }
    let mut want: Vec<Vec<u8>> = odd.iter().map(|n| n.as_bytes().to_vec()).collect();
    want.sort();
    assert_eq!(show(&names(s, &r)), show(&want));
    for n in odd {
        let b = n.as_bytes();
        assert_eq!(stat_of(s, &r, b).size, b.len() as u64, "{n:?}");
        assert_eq!(read_all(s, &r, b).expect("read"), b, "{n:?}");
    }
    // A nested path of odd names (rclone's fstests use this one).
    let mut dir = s.make_dir(&r, c"hello? sausage").expect("make_dir");
    for part in ["\u{ea}\u{e9}", "Hello, \u{4e16}\u{754c}"] {
        dir = s.make_dir(&dir, &c(part.as_bytes())).expect("make_dir");
    }
    let leaf = " \" ' @ < > & ? + \u{2260}";
    put(s, &dir, leaf.as_bytes(), b"leaf").expect("put leaf");
    let mut d = s.open_dir(&r, c"hello? sausage").expect("open_dir");
    for part in ["\u{ea}\u{e9}", "Hello, \u{4e16}\u{754c}"] {
        assert_eq!(show(&names(s, &d)), [part]);
        d = s.open_dir(&d, &c(part.as_bytes())).expect("open_dir");
    }
    assert_eq!(show(&names(s, &d)), [leaf]);
    assert_eq!(read_all(s, &d, leaf.as_bytes()).expect("read"), b"leaf");
    // Renamed and removed by their odd names.
    if unless_unsupported(s.rename(&r, c"100%", &r, c"a+b%20c"), "rename").is_some() {
        assert_eq!(read_all(s, &r, b"a+b%20c").expect("read"), b"100%");
        assert!(s.stat(&r, c"100%").expect("stat").is_none());
        s.remove(&r, c"a+b%20c", false).expect("remove");
    }
    for n in odd.iter().filter(|n| **n != "100%") {
        s.remove(&r, &c(n.as_bytes()), false)
            .unwrap_or_else(|e| panic!("remove {n:?}: {e}"));
    }
    s.remove(&r, c"hello? sausage", true).expect("remove tree");
    assert_eq!(show(&names(s, &r)), Vec::<String>::new());
}

/// Names of 255 bytes (the longest most filesystems take), ASCII and
/// multi-byte.
pub fn long_name<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let ascii = [b'n'; 255];
    let multi = ["\u{e9}".repeat(127), "x".to_string()].concat();
    assert_eq!(multi.len(), 255);
    for n in [&ascii[..], multi.as_bytes()] {
        put(s, &r, n, n).expect("put a 255-byte name");
        assert_eq!(read_all(s, &r, n).expect("read"), n);
        assert_eq!(stat_of(s, &r, n).size, 255);
    }
    assert_eq!(names(s, &r), owned(&[&ascii, multi.as_bytes()]));
    let mut other = ascii;
    other[0] = b'm';
    if unless_unsupported(s.rename(&r, &c(&ascii), &r, &c(&other)), "rename").is_some() {
        assert_eq!(read_all(s, &r, &other).expect("read"), ascii);
    }
}

// ------------------------------------------------------------------ big

/// A file of 64 MiB + 1 byte (a multipart upload on S3), read back whole
/// and, where offered, by ranges across its middle and its end.
pub fn big_file<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let size = (64 << 20) + 1;
    let meta = file_meta(size, T0, 0o644);
    put_from(s, &r, c"big", &mut Pattern::new(size, 64), &meta).expect("put big");
    let m = stat_of(s, &r, b"big");
    assert_eq!(m.size, size);
    assert_mtime(fx, &m, T0, "big");
    let mut reader = s.open_file(&r, c"big").expect("open_file");
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = reader.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        let bad = (0..n).find(|&i| buf[i] != Pattern::byte(64, at + i as u64));
        assert!(bad.is_none(), "byte {} differs", at + bad.unwrap() as u64);
        at += n as u64;
    }
    assert_eq!(at, size);
    let reader = s.open_file(&r, c"big").expect("open_file");
    if let Some(rg) = reader.ranged() {
        for (off, len) in [(size / 2 - 3, 9), (size - 2, 2), ((8 << 20) - 1, 2)] {
            let mut got = Vec::new();
            let mut take = |_, b: &[u8]| {
                got.extend_from_slice(b);
                Ok(())
            };
            rg.read_range(off, len, &mut take, None)
                .expect("read_range");
            let want: Vec<u8> = (off..off + len).map(|i| Pattern::byte(64, i)).collect();
            assert_eq!(got, want, "range ({off}, {len})");
        }
    }
}

// ------------------------------------------------------------------ errors

/// A store the backend refuses changes to fails with `PermissionDenied`
/// when writing or removing, and the root keeps exactly what it had.
pub fn permission_denied<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"keep", b"kept").expect("put");
    let denied = match fx.denied() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("permission_denied: not checked: {why}");
            return;
        }
    };
    let ds = &denied.store;
    let dr = ds.create_root().expect("create_root");
    let meta = file_meta(3, T0, 0o644);
    let write = put_from(ds, &dr, c"new", &mut Bytes(b"new"), &meta);
    assert_eq!(err_kind(write), Some(ErrorKind::PermissionDenied));
    let empty = ds.create_empty(&dr, c"empty", &file_meta(0, T0, 0o644), false);
    assert!(
        matches!(&empty, Ok(false)) || err_kind(empty) == Some(ErrorKind::PermissionDenied),
        "create_empty in a denied store"
    );
    assert_eq!(
        err_kind(ds.remove(&dr, c"keep", false)),
        Some(ErrorKind::PermissionDenied)
    );
    drop(denied);
    assert_eq!(show(&names(s, &r)), ["keep"]);
    assert_eq!(read_all(s, &r, b"keep").expect("read"), b"kept");
}

// ------------------------------------------------------------------ open_ahead

/// [`PipelineStore::open_ahead`](ferry_engine::store::PipelineStore::open_ahead) is a hint only:
/// files named in it read their whole current content in any order (one whose size changed since it
/// was listed too: more or fewer bytes than named, never cut at the size named), a missing one
/// fails with `NotFound` when opened, and files named but never opened leave nothing behind.
pub fn read_ahead<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let files: Vec<(&[u8], Vec<u8>)> = vec![
        (b"a", Pattern::bytes(4096, 1)),
        (b"b", Pattern::bytes(10, 2)),
        (b"c", Pattern::bytes(100 << 10, 3)),
        (b"grew", Pattern::bytes(5000, 4)),
        (b"shrank", Pattern::bytes(3, 5)),
        (b"unread", Pattern::bytes(7, 6)),
    ];
    for (name, data) in &files {
        put(s, &r, name, data).expect("put");
    }
    let named: Vec<(std::ffi::CString, u64)> = [
        (&b"a"[..], 4096),
        (b"b", 10),
        (b"c", 100 << 10),
        (b"grew", 5),
        (b"shrank", 100),
        (b"unread", 7),
        (b"gone", 4),
    ]
    .iter()
    .map(|(n, z)| (c(n), *z))
    .collect();
    let hint: Vec<(&std::ffi::CStr, u64)> = named.iter().map(|(n, z)| (n.as_c_str(), *z)).collect();
    s.open_ahead(&r, &hint);
    for name in [&b"c"[..], b"grew", b"a", b"shrank", b"b"] {
        let want = &files.iter().find(|(n, _)| *n == name).expect("a file").1;
        let got = read_all(s, &r, name).expect("read");
        assert!(
            &got == want,
            "{}: {} bytes read, {} there",
            String::from_utf8_lossy(name),
            got.len(),
            want.len()
        );
    }
    assert_eq!(
        err_kind(read_all(s, &r, b"gone")),
        Some(ErrorKind::NotFound)
    );
    drop(r);
    // Read again after the hint's directory is gone: the same bytes.
    let r = root(s);
    assert!(read_all(s, &r, b"unread").expect("read") == Pattern::bytes(7, 6));
    let mut all = names(s, &r);
    all.sort();
    assert_eq!(
        show(&all),
        ["a", "b", "c", "grew", "shrank", "unread"],
        "nothing else in the directory"
    );
}
