//! Tests of [`super`] (plan.rs).

use super::*;
use crate::journal::Snapshot;
use crate::tree::{key_of, Tree};

#[test]
fn conflict_names() {
    assert_eq!(
        conflict_name(b"report.txt", Side::B, "2026-11-22 1530", 1),
        b"report (conflict 2026-11-22 1530 from B).txt".to_vec()
    );
    assert_eq!(
        conflict_name(b".bashrc", Side::A, "2026-11-22 1530", 2),
        b".bashrc (conflict 2026-11-22 1530 from A 2)".to_vec()
    );
    assert_eq!(
        conflict_name(b"a.tar.gz", Side::B, "x", 1),
        b"a.tar (conflict x from B).gz".to_vec()
    );
}

/// Long names: the result fits NAME_MAX, keeps the stamp and the
/// extension, and never splits a UTF-8 character.
#[test]
fn conflict_names_fit_name_max() {
    let stamp = "2026-11-22 1530";
    let long = format!("{}.txt", "é".repeat(126)); // 256 bytes
    for n in [1, 2, 17] {
        let c = conflict_name(long.as_bytes(), Side::B, stamp, n);
        assert!(c.len() <= NAME_MAX, "{}", c.len());
        let c = String::from_utf8(c).expect("still UTF-8");
        assert!(c.ends_with(").txt"), "{c}");
        assert!(c.contains(" (conflict 2026-11-22 1530 from B"), "{c}");
        assert!(c.starts_with("éé"), "{c}");
    }
    // An extension too long to keep beside the stamp is cut like a stem.
    let ext = format!("a.{}", "x".repeat(250));
    let c = conflict_name(ext.as_bytes(), Side::A, stamp, 1);
    assert!(c.len() <= NAME_MAX);
    assert!(c.ends_with(b" (conflict 2026-11-22 1530 from A)"));
    // A name that is not UTF-8 is cut before a continuation byte.
    let raw: Vec<u8> = [b'\xff'; 250].iter().copied().chain(*b".bin").collect();
    let c = conflict_name(&raw, Side::B, stamp, 1);
    assert!(c.len() <= NAME_MAX && c.ends_with(b").bin"));
    // Short names are unchanged by the rule.
    assert_eq!(
        conflict_name(b"r.txt", Side::B, "x", 1),
        b"r (conflict x from B).txt".to_vec()
    );
}

#[test]
fn still_sees_another_version_of_the_same_size_and_mtime() {
    let mut p = f(10, 0);
    p.version = 7;
    let mut n = p;
    assert!(still(Some(&n), Some(&p)));
    n.version = 0;
    assert!(still(Some(&n), Some(&p)), "a stat that knows no version");
    n.version = 8;
    assert!(!still(Some(&n), Some(&p)));
    assert!(!still(None, Some(&p)));
    assert!(still(None, None));
}

#[test]
fn stamps() {
    assert_eq!(stamp(0), "1970-01-01 0000");
    assert_eq!(stamp(1_795_361_400), "2026-11-22 1530");
    assert_eq!(stamp(-60), "1969-12-31 2359");
    assert_eq!(stamp(951_825_600), "2000-02-29 1200");
}

fn f(size: u64, ino: u64) -> Meta {
    Meta {
        kind: Kind::File,
        size,
        mtime_sec: 5,
        mtime_nsec: 0,
        mode: 0o644,
        uid: 0,
        gid: 0,
        ino,
        version: 0,
        rdev: 0,
        sparse: false,
        nlink: 0,
        dev: 0,
        ctime: 0,
    }
}

fn d(ino: u64) -> Meta {
    Meta {
        kind: Kind::Dir,
        ..f(0, ino)
    }
}

/// Two local trees.
const LOCAL: Sides = Sides {
    implicit_dirs: [false; 2],
    inodes: [true; 2],
};

/// Names held on either tree.
fn taken<'t>(a: &'t Tree, b: &'t Tree) -> impl Fn(&[u8]) -> bool + 't {
    |k| a.get(k).is_some() || b.get(k).is_some()
}

fn scan(ents: &[(&str, Meta)]) -> Tree {
    let mut v: Vec<(Vec<u8>, Meta)> = ents
        .iter()
        .map(|(p, m)| (key_of(p.as_bytes()), *m))
        .collect();
    v.sort_by(|x, y| x.0.cmp(&y.0));
    Tree::of(&v)
}

fn journal(ents: &[(&str, Meta, Meta)]) -> Snapshot {
    let mut v: Vec<(Vec<u8>, Synced)> = ents
        .iter()
        .map(|(p, a, b)| (key_of(p.as_bytes()), Synced { a: *a, b: *b }))
        .collect();
    v.sort_by(|x, y| x.0.cmp(&y.0));
    Snapshot::from_keys(v)
}

fn acts(p: &Plan) -> Vec<(String, Act)> {
    p.items
        .iter()
        .map(|it| {
            (
                String::from_utf8(crate::tree::path_of(&it.key)).unwrap(),
                it.act.clone(),
            )
        })
        .collect()
}

/// A journal holding records under a directory it has no record of
/// (a killed run can leave one) still has them judged.
#[test]
fn records_below_an_unrecorded_directory_are_judged() {
    let j = journal(&[("gone/x", f(1, 3), f(1, 4)), ("kept", f(1, 5), f(1, 6))]);
    let a = scan(&[("kept", f(1, 5))]);
    let b = scan(&[("kept", f(1, 6))]);
    let p = merge(&a, &b, &j, LOCAL);
    assert_eq!(acts(&p), vec![("gone/x".to_string(), Act::Forget)]);
    assert_eq!(p.unchanged, 1);
}

#[test]
fn dir_deleted_on_a_new_file_on_b_survives() {
    let j = journal(&[("d", d(1), d(2)), ("d/old", f(1, 3), f(1, 4))]);
    let a = scan(&[]);
    let b = scan(&[("d", d(2)), ("d/old", f(1, 4)), ("d/new", f(2, 5))]);
    let mut p = merge(&a, &b, &j, LOCAL);
    finish(&mut p, &taken(&a, &b), "s", &|v| vec![true; v.len()]);
    assert_eq!(
        acts(&p),
        vec![
            ("d".into(), Act::Copy { from: Side::B }),
            ("d/new".into(), Act::Copy { from: Side::B }),
            ("d/old".into(), Act::Delete { on: Side::B }),
        ]
    );
}

#[test]
fn file_replacing_a_dir_with_new_content_is_a_conflict() {
    let j = journal(&[("d", d(1), d(2)), ("d/old", f(1, 3), f(1, 4))]);
    let a = scan(&[("d", f(9, 7))]);
    let b = scan(&[("d", d(2)), ("d/old", f(1, 4)), ("d/new", f(2, 5))]);
    let mut p = merge(&a, &b, &j, LOCAL);
    finish(&mut p, &taken(&a, &b), "s", &|v| vec![true; v.len()]);
    let got = acts(&p);
    assert_eq!(
        got[0],
        (
            "d".into(),
            Act::Conflict {
                loser: Side::A,
                name: key_of(b"d (conflict s from A)")
            }
        )
    );
    assert_eq!(got[1], ("d/new".into(), Act::Copy { from: Side::B }));
}

#[test]
fn rename_by_inode() {
    let j = journal(&[("x", f(3, 10), f(3, 20))]);
    let a = scan(&[("sub", d(1)), ("sub/y", f(3, 10))]);
    let b = scan(&[("x", f(3, 20))]);
    let mut p = merge(&a, &b, &j, LOCAL);
    let asked = Mutex::new(Vec::new());
    finish(&mut p, &taken(&a, &b), "s", &|v| {
        asked.lock().extend_from_slice(v);
        vec![true; v.len()]
    });
    assert_eq!(
        acts(&p),
        vec![
            ("sub".into(), Act::Copy { from: Side::A }),
            (
                "sub/y".into(),
                Act::Rename {
                    on: Side::B,
                    from: 2
                }
            ),
            ("x".into(), Act::RenamedAway),
        ]
    );
    assert_eq!(p.deletes, [0, 0]);
    // The new path on A is compared with the old path's copy on B.
    assert_eq!(
        asked.into_inner(),
        vec![(Side::A, key_of(b"sub/y"), key_of(b"x"))]
    );
}

/// A deleted file's inode reused by a new file of the same size and
/// mtime: unless the bytes are those of the old path, it is a delete
/// plus a create, not a rename.
#[test]
fn inode_reuse_is_not_a_rename() {
    let j = journal(&[("h", f(3, 10), f(3, 20))]);
    let a = scan(&[("k", f(3, 10))]);
    let b = scan(&[("h", f(3, 20))]);
    let mut p = merge(&a, &b, &j, LOCAL);
    finish(&mut p, &taken(&a, &b), "s", &|v| vec![false; v.len()]);
    assert_eq!(
        acts(&p),
        vec![
            ("h".into(), Act::Delete { on: Side::B }),
            ("k".into(), Act::Copy { from: Side::A }),
        ]
    );
    assert_eq!(p.deletes, [0, 1]);
}

#[test]
fn rename_without_inodes_needs_same_bytes() {
    let j = journal(&[("x", f(3, 0), f(3, 0))]);
    let a = scan(&[("y", f(3, 0))]);
    let b = scan(&[("x", f(3, 0))]);
    let mut p = merge(&a, &b, &j, LOCAL);
    finish(&mut p, &taken(&a, &b), "s", &|v| vec![false; v.len()]);
    assert_eq!(acts(&p)[1], ("y".into(), Act::Copy { from: Side::A }));
    assert_eq!(p.deletes, [0, 1]);
    let mut p = merge(&a, &b, &j, LOCAL);
    finish(&mut p, &taken(&a, &b), "s", &|v| vec![true; v.len()]);
    assert_eq!(acts(&p)[0], ("x".into(), Act::RenamedAway));
}

#[test]
fn implicit_dirs_are_not_deleted() {
    let j = journal(&[("e", d(1), d(0))]);
    let a = scan(&[("e", d(1))]);
    let b = scan(&[]);
    let p = merge(
        &a,
        &b,
        &j,
        Sides {
            implicit_dirs: [false, true],
            inodes: [true, false],
        },
    );
    assert!(p.items.is_empty());
    assert_eq!(p.unchanged, 1);
}
