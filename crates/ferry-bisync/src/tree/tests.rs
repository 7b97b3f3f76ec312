//! Tests of [`super`] (tree.rs).

use super::*;
use crate::journal::Snapshot;
use crate::plan::merge;
use crate::reconcile::Synced;
use ferry_local::LocalStore;
use proptest::prelude::*;

/// Every entry of a local tree, listed through the store (the metadata
/// the scan sees).
fn full_scan(s: &LocalStore) -> Tree {
    fn go(
        s: &LocalStore,
        d: &<LocalStore as Store>::Dir,
        rel: &[u8],
        out: &mut Vec<(Vec<u8>, Meta)>,
    ) {
        let mut l = Listing::new();
        let mut errs = Vec::new();
        s.list(d, rel, &mut l, &mut errs).unwrap();
        for e in l.entries() {
            let p = join(rel, l.name(e));
            out.push((key_of(&p), e.meta));
            if e.meta.kind == Kind::Dir {
                let c = s.open_dir(d, l.cname(e)).unwrap();
                go(s, &c, &p, out);
            }
        }
    }
    let (root, _) = s.open_root().unwrap().unwrap();
    let mut v = Vec::new();
    go(s, &root, b"", &mut v);
    Tree::of(&v)
}

/// Paths of a random tree: `d` ending = directory.
fn tree() -> impl Strategy<Value = Vec<String>> {
    let name = prop::sample::select(vec!["a", "b", "c", "a.x", "a-"]);
    let path = prop::collection::vec(name, 1..4).prop_map(|v| v.join("/"));
    prop::collection::vec((path, any::<bool>()), 0..25).prop_map(|v| {
        v.into_iter()
            .map(|(p, d)| if d { format!("{p}/") } else { p })
            .collect()
    })
}

fn make(root: &std::path::Path, paths: &[String]) {
    for p in paths {
        let full = root.join(p.trim_end_matches('/'));
        let parent_ok = full
            .parent()
            .is_none_or(|d| std::fs::create_dir_all(d).is_ok());
        if !parent_ok || full.exists() {
            continue;
        }
        if p.ends_with('/') {
            let _ = std::fs::create_dir(&full);
        } else {
            let _ = std::fs::write(&full, p.as_bytes());
        }
    }
}

const EMPTY: Meta = Meta {
    kind: Kind::File,
    size: 0,
    mtime_sec: 0,
    mtime_nsec: 0,
    mode: 0o644,
    uid: 0,
    gid: 0,
    ino: 0,
    version: 0,
    rdev: 0,
    sparse: false,
    nlink: 0,
    dev: 0,
    ctime: 0,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The merge done as listings arrive gives the plan of the
    /// reference merge over complete scans, whatever the journal holds
    /// (records matching either side, stale ones, records under
    /// directories nobody has, in no particular shape).
    #[test]
    fn scan_merge_equals_the_reference(
        ta in tree(),
        tb in tree(),
        picks in prop::collection::vec((0usize..64, 0u8..4), 0..40),
        jobs in 2usize..5,
    ) {
        let d = tempfile::tempdir().unwrap();
        let (ra, rb) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir(&ra).unwrap();
        std::fs::create_dir(&rb).unwrap();
        make(&ra, &ta);
        make(&rb, &tb);
        let (sa, sb) = (LocalStore::new(&ra, 1), LocalStore::new(&rb, 1));
        let (fa, fb) = (full_scan(&sa), full_scan(&sb));
        // Journal records: for keys of either side (or orphans under
        // `z/`), each side's entry as it is now, changed, or a directory.
        let mut keys: Vec<(Vec<u8>, Meta)> = Vec::new();
        for (dir, l) in fa.dirs.iter().chain(fb.dirs.iter()) {
            for e in l.entries() {
                keys.push((key_of(&join(dir, l.name(e))), e.meta));
            }
        }
        keys.sort_by(|x, y| x.0.cmp(&y.0));
        keys.dedup_by(|x, y| x.0 == y.0);
        let mut recs: Vec<(Vec<u8>, Synced)> = Vec::new();
        for (i, how) in picks {
            let (key, m) = match keys.get(i) {
                Some(k) => k.clone(),
                None => (key_of(format!("z/y{}/f", i % 3).as_bytes()), keys.first().map_or(EMPTY, |k| k.1)),
            };
            let mut r = Synced { a: fa.get(&key).copied().unwrap_or(m), b: fb.get(&key).copied().unwrap_or(m) };
            match how {
                0 => {}
                1 => r.a.size += 1,
                2 => r.b.mtime_sec -= 5,
                _ => { r.a.kind = Kind::Dir; r.b.kind = Kind::Dir; }
            }
            if recs.iter().all(|(k, _)| *k != key) {
                recs.push((key, r));
            }
        }
        let snap = Snapshot::from_keys(recs.clone());
        let sides = Sides::default();
        let want = merge(&fa, &fb, &snap, sides);
        let (ca, cb) = (sa.open_root().unwrap().unwrap().0, sb.open_root().unwrap().unwrap().0);
        let fail = |p: &[u8], e: &io::Error| panic!("{}: {e}", String::from_utf8_lossy(p));
        let opts = ScanOpts::<LocalStore, LocalStore> {
            sides,
            jobs,
            filter: None,
            checksum: false,
            on_error: &fail,
            compare: None,
            in_sync: InSync::Keep,
            stop_if_both_hold: false,
            reserved: Reserved::default(),
            stopping: &|| false,
        };
        let (got, _, _) = scan_merge(
            (&sa, Some(ca)),
            (&sb, Some(cb)),
            &Snapshot::from_keys(recs),
            &opts,
        )
        .unwrap();
        let acts = |p: &Plan| -> Vec<(Vec<u8>, crate::plan::Act)> {
            p.items.iter().map(|it| (it.key.clone(), it.act.clone())).collect()
        };
        prop_assert_eq!(acts(&got), acts(&want));
        prop_assert_eq!(got.unchanged, want.unchanged);
        prop_assert_eq!(got.scanned, want.scanned);
        prop_assert_eq!(got.known, want.known);
    }
}

#[test]
fn keys_sort_like_a_walk() {
    let mut v = [
        key_of(b"a.b"),
        key_of(b"a/x"),
        key_of(b"a"),
        key_of(b"a/x/y"),
        key_of(b"a-"),
    ];
    v.sort();
    let p: Vec<Vec<u8>> = v.iter().map(|k| path_of(k)).collect();
    assert_eq!(
        p,
        vec![
            b"a".to_vec(),
            b"a/x".to_vec(),
            b"a/x/y".to_vec(),
            b"a-".to_vec(),
            b"a.b".to_vec()
        ]
    );
    assert_eq!(parent_key(&key_of(b"a/x/y")), Some(&key_of(b"a/x")[..]));
    assert_eq!(name_of(&key_of(b"a/x/y")), b"y");
    assert!(under_any(&[key_of(b"a/x")], &key_of(b"a/x/y")));
    assert!(!under_any(&[key_of(b"a/x")], &key_of(b"a/xy")));
}
