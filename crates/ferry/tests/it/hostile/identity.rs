//! Hostile tests: identity (see main.rs). One directory under two names (a
//! bind mount of a root or of a subdirectory, a symlink, `..`), as SRC, DST,
//! a replica or a backup directory: the run is refused with exit 2 and one
//! line, and no file of SRC or DST changes. Snapshots are taken with no
//! mount in place (a mount can make a tree a loop) and compared after the
//! mounts are gone.
use crate::util::*;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

/// `mount --bind from to`, unmounted when dropped.
struct Bind(PathBuf);

impl Bind {
    fn new(from: &Path, to: &Path) -> Result<Bind, String> {
        fs::create_dir_all(to).unwrap();
        let ok = std::process::Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(to)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err("`mount --bind` is not possible here (not root?)".into());
        }
        Ok(Bind(to.to_path_buf()))
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn o(p: &Path) -> OsString {
    p.as_os_str().to_owned()
}

fn s(x: &str) -> OsString {
    OsString::from(x)
}

/// A tree with files at the top and below.
fn sample(root: &Path, tag: &str) {
    write(root, "top.txt", format!("top of {tag}").as_bytes());
    write(root, "sub/in.txt", format!("in sub of {tag}").as_bytes());
    write(root, "sub/deep/d.txt", format!("deep in {tag}").as_bytes());
    write(root, "other/o.txt", format!("other of {tag}").as_bytes());
}

/// Exit 2 with exactly one line on stderr, which says `says`.
#[track_caller]
fn refused(r: &Run, says: &str) {
    r.code_is(2);
    let err = r.err();
    assert_eq!(err.lines().count(), 1, "not one line\n{r}");
    assert!(err.starts_with("ferry: ") && err.contains(says), "{r}");
}

/// Snapshots of `roots`.
fn snaps(roots: &[&Path]) -> Vec<Snapshot> {
    roots.iter().map(|r| snapshot(r)).collect()
}

#[track_caller]
fn unchanged(roots: &[&Path], before: &[Snapshot]) {
    for (r, b) in roots.iter().zip(before) {
        assert_same_content(b, &snapshot(r));
    }
}

/// `mount --bind v2/sub w; ferry sync w v2` deleted SRC's own files (v2's
/// `sub` is SRC, and SRC has no `sub`).
#[test]
fn src_bound_to_a_subdirectory_of_dst_is_refused() {
    let t = tmpdir();
    let v2 = t.path().join("v2");
    sample(&v2, "v2");
    let w = t.path().join("w");
    fs::create_dir(&w).unwrap();
    let before = snaps(&[&v2]);
    {
        let _m = need!(Bind::new(&v2.join("sub"), &w));
        for cmd in ["sync", "copy"] {
            let r = ferry([s(cmd), o(&w), o(&v2)]);
            refused(&r, "inside");
        }
        // Deeper: w is v2/sub/deep.
    }
    unchanged(&[&v2], &before);
    {
        let _m = need!(Bind::new(&v2.join("sub/deep"), &w));
        let r = ferry([s("sync"), o(&w), o(&v2)]);
        refused(&r, "same device and inode");
    }
    unchanged(&[&v2], &before);
}

/// `ferry sync v3 w` with `w` bound to `v3/sub` recursed until a stack
/// overflow (exit 134), writing into SRC.
#[test]
fn dst_bound_to_a_subdirectory_of_src_is_refused() {
    let t = tmpdir();
    let v3 = t.path().join("v3");
    sample(&v3, "v3");
    let w = t.path().join("w");
    fs::create_dir(&w).unwrap();
    let before = snaps(&[&v3]);
    for at in ["sub", "sub/deep"] {
        {
            let _m = need!(Bind::new(&v3.join(at), &w));
            for cmd in ["sync", "copy"] {
                let r = ferry([s(cmd), o(&v3), o(&w)]);
                refused(&r, "inside");
            }
            // A new DST below the mount: inside SRC too.
            let r = ferry([s("copy"), o(&v3), o(&w.join("new"))]);
            refused(&r, "inside");
        }
        unchanged(&[&v3], &before);
    }
}

/// A mount inside DST that shows SRC, SRC's parent, or a directory inside
/// SRC: walking DST meets SRC again (sync would delete it through DST).
#[test]
fn a_mount_inside_a_tree_showing_the_other_is_refused() {
    let t = tmpdir();
    let src = t.path().join("s");
    let dst = t.path().join("d");
    sample(&src, "s");
    sample(&dst, "d");
    fs::create_dir(dst.join("m")).unwrap();
    fs::create_dir(src.join("m")).unwrap();
    let before = snaps(&[&src, &dst]);
    for (from, at) in [
        (src.clone(), dst.join("m")),
        (t.path().to_path_buf(), dst.join("m")),
        (src.join("sub"), dst.join("m")),
        (dst.join("sub"), src.join("m")),
        (dst.clone(), src.join("m")),
    ] {
        {
            let _m = need!(Bind::new(&from, &at));
            for cmd in ["sync", "copy"] {
                let r = ferry([s(cmd), o(&src), o(&dst)]);
                refused(&r, "same device and inode");
            }
            let j = t.path().join("j.sqlite");
            let r = ferry([
                s("bisync"),
                s("--resync"),
                s("--journal"),
                o(&j),
                o(&src),
                o(&dst),
            ]);
            refused(&r, "same device and inode");
        }
        unchanged(&[&src, &dst], &before);
    }
}

/// A mount inside DST of another filesystem (tmpfs) in a directory sync
/// deletes: never deleted through (exit 1, one error line), its files stay.
#[test]
fn sync_never_deletes_through_a_mount_point() {
    let t = tmpdir();
    let src = t.path().join("s");
    let dst = t.path().join("d");
    sample(&src, "s");
    write(&dst, "gone/g.txt", b"g");
    fs::create_dir_all(dst.join("gone/mnt")).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(dst.join("gone/mnt"))
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: tmpfs cannot be mounted here");
        return;
    }
    let _m = Bind(dst.join("gone/mnt"));
    write(&dst, "gone/mnt/precious.txt", b"precious");
    let r = ferry([s("sync"), o(&src), o(&dst)]);
    r.code_is(1);
    assert!(r.err().contains("mount point"), "{r}");
    assert_eq!(
        fs::read(dst.join("gone/mnt/precious.txt")).unwrap(),
        b"precious"
    );
}

/// `bisync --resync w A` with `w` bound to `A/sub` grew A on every run.
#[test]
fn bisync_replica_bound_to_a_subdirectory_of_the_other_is_refused() {
    let t = tmpdir();
    let a = t.path().join("A");
    sample(&a, "A");
    let w = t.path().join("w");
    fs::create_dir(&w).unwrap();
    let j = t.path().join("j.sqlite");
    let before = snaps(&[&a]);
    {
        let _m = need!(Bind::new(&a.join("sub"), &w));
        for _ in 0..2 {
            for (x, y) in [(&w, &a), (&a, &w)] {
                let r = ferry([
                    s("bisync"),
                    s("--resync"),
                    s("--journal"),
                    o(&j),
                    o(x),
                    o(y),
                ]);
                refused(&r, "inside");
            }
        }
    }
    unchanged(&[&a], &before);
}

/// `--backup-dir` naming DST itself (`../d`, a symlink to it), SRC (`../s`,
/// a symlink), inside SRC, or a directory holding DST: refused, nothing
/// changed (it kept into DST, then removed the kept copy as a temporary;
/// or replaced SRC's files with DST's old ones).
#[test]
fn backup_dir_aliasing_a_root_is_refused() {
    let t = tmpdir();
    let src = t.path().join("s");
    let dst = t.path().join("d");
    sample(&src, "s");
    sample(&dst, "d");
    write(&dst, "only-in-dst.txt", b"old");
    let ld = ln(t.path(), "link-d", &dst);
    let ls = ln(t.path(), "link-s", &src);
    let before = snaps(&[&src, &dst]);
    let cases: Vec<(OsString, &str)> = vec![
        (s("../d"), "is DST"),
        (o(&ld), "is DST"),
        (s("../s"), "is SRC"),
        (o(&ls), "is SRC"),
        (s("../s/bak"), "inside SRC"),
        (o(&ls.join("bak")), "inside SRC"),
        (s(".."), "holds"),
        (o(t.path()), "holds"),
    ];
    for (dir, says) in &cases {
        for cmd in ["sync", "copy"] {
            let r = ferry([s(cmd), s("--backup-dir"), dir.clone(), o(&src), o(&dst)]);
            refused(&r, says);
        }
    }
    unchanged(&[&src, &dst], &before);
    // A backup directory bound onto SRC.
    let bk = t.path().join("bk");
    fs::create_dir(&bk).unwrap();
    {
        let _m = need!(Bind::new(&src, &bk));
        let r = ferry([s("sync"), s("--backup-dir"), o(&bk), o(&src), o(&dst)]);
        refused(&r, "is SRC");
    }
    unchanged(&[&src, &dst], &before);
}

/// `--backup-dir ../d/bak` (inside DST, named from outside) or a symlink
/// to `d/bak`: left out of the run as `--backup-dir bak` is; the old
/// content is kept there and never deleted as a stale entry.
#[test]
fn backup_dir_inside_dst_by_another_name_is_left_out() {
    let t = tmpdir();
    let src = t.path().join("s");
    let dst = t.path().join("d");
    write(&src, "f.txt", b"new content");
    let link = ln(t.path(), "link-bak", dst.join("bak"));
    for (i, dir) in [s("../d/bak"), o(&link)].into_iter().enumerate() {
        let _ = fs::remove_dir_all(&dst);
        write(&dst, "f.txt", format!("old {i}").as_bytes());
        write(&dst, "bak/earlier.txt", b"kept before");
        let r = ferry([s("sync"), s("--backup-dir"), dir, o(&src), o(&dst)]);
        r.ok();
        assert_eq!(fs::read(dst.join("f.txt")).unwrap(), b"new content", "{r}");
        assert_eq!(
            fs::read(dst.join("bak/f.txt")).unwrap(),
            format!("old {i}").as_bytes(),
            "the old content is not kept\n{r}"
        );
        assert_eq!(
            fs::read(dst.join("bak/earlier.txt")).unwrap(),
            b"kept before"
        );
        // SRC is never written.
        assert_eq!(walk(&src), vec![PathBuf::from("f.txt")]);
    }
}

/// bisync `--backup-dir1` through a symlink (or `..`) into the other
/// replica, or A's and B's backup directories one inside the other by
/// another name: refused, nothing changed.
#[test]
fn bisync_backup_dirs_aliasing_a_replica_are_refused() {
    let t = tmpdir();
    let a = t.path().join("A");
    let b = t.path().join("B");
    sample(&a, "A");
    sample(&b, "B");
    let lb = ln(t.path(), "link-b", &b);
    fs::create_dir(t.path().join("k")).unwrap();
    ln(t.path(), "lk", t.path().join("k"));
    let j = t.path().join("j.sqlite");
    let before = snaps(&[&a, &b]);
    for (flags, says) in [
        (vec![s("--backup-dir1"), o(&lb.join("x"))], "inside B"),
        (vec![s("--backup-dir1"), s("../B/x")], "inside B"),
        (vec![s("--backup-dir2"), o(&lb)], "is B"),
        (
            vec![s("--backup-dir1"), s(".."), s("--backup-dir2"), s("../bb")],
            "holds",
        ),
        (
            vec![
                s("--backup-dir1"),
                s("../k"),
                s("--backup-dir2"),
                o(&t.path().join("k/in")),
            ],
            "one inside the other",
        ),
        (
            vec![
                s("--backup-dir1"),
                s("../k"),
                s("--backup-dir2"),
                o(&t.path().join("lk")),
            ],
            "both A and B",
        ),
    ] {
        let mut args = vec![s("bisync"), s("--resync"), s("--journal"), o(&j)];
        args.extend(flags);
        args.extend([o(&a), o(&b)]);
        let r = ferry(&args);
        refused(&r, says);
    }
    unchanged(&[&a, &b], &before);
}

/// SRC's own `.ferry-versions`, or an entry named like the backup
/// directory inside DST, is left out with one note (was: silently).
#[test]
fn src_entries_left_out_are_said_once() {
    let t = tmpdir();
    let src = t.path().join("s");
    let dst = t.path().join("d");
    write(&src, "f.txt", b"f");
    write(&src, ".ferry-versions/v~20260101-000000.txt", b"v");
    write(&src, "bak/x.txt", b"x");
    let r = ferry([s("copy"), o(&src), o(&dst)]);
    r.ok();
    let err = r.err();
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("left out")).collect();
    assert_eq!(notes.len(), 1, "{r}");
    assert!(notes[0].contains(".ferry-versions"), "{r}");
    let dst = t.path().join("d2");
    let r = ferry([s("sync"), s("--backup-dir"), s("bak"), o(&src), o(&dst)]);
    r.ok();
    let err = r.err();
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("left out")).collect();
    assert_eq!(notes.len(), 2, "one note for each\n{r}");
    assert!(notes.iter().any(|l| l.contains("SRC bak:")), "{r}");
    assert!(!dst.join("bak/x.txt").exists(), "{r}");
    assert!(!dst.join(".ferry-versions").exists(), "{r}");
}

/// DST's `.ferry-versions` a symlink to SRC, or to another directory of DST:
/// `--versions` would keep into SRC, or into a directory the run syncs.
#[test]
fn versions_dir_aliasing_a_root_is_refused() {
    let t = tmpdir();
    let src = t.path().join("s");
    let dst = t.path().join("d");
    sample(&src, "s");
    sample(&dst, "d");
    for (target, says) in [
        (src.clone(), "is SRC"),
        (dst.join("other"), "elsewhere inside DST"),
    ] {
        let _ = fs::remove_file(dst.join(".ferry-versions"));
        ln(&dst, ".ferry-versions", &target);
        let before = snaps(&[&src, &dst]);
        let r = ferry([s("sync"), s("--versions"), o(&src), o(&dst)]);
        refused(&r, says);
        let j = t.path().join("j.sqlite");
        let r = ferry([
            s("bisync"),
            s("--resync"),
            s("--versions"),
            s("--journal"),
            o(&j),
            o(&src),
            o(&dst),
        ]);
        refused(&r, says.replace("SRC", "A").replace("DST", "B").as_str());
        unchanged(&[&src, &dst], &before);
    }
}

/// One file: `--backup-dir` naming SRC's own directory would keep DST's
/// old file over SRC (the same name): refused, nothing changed.
#[test]
fn one_file_kept_over_src_is_refused() {
    let t = tmpdir();
    let src = t.path().join("s");
    let dst = t.path().join("d");
    write(&src, "f.txt", b"the source");
    write(&dst, "f.txt", b"the old destination");
    write(&src, "g.txt", b"another");
    let before = snaps(&[&src, &dst]);
    let r = ferry([
        s("copy"),
        s("--backup-dir"),
        s("../s"),
        o(&src.join("f.txt")),
        o(&dst.join("f.txt")),
    ]);
    refused(&r, "which is SRC");
    unchanged(&[&src, &dst], &before);
    // Another name there is fine: g.txt kept beside SRC's f.txt is no harm.
    let r = ferry([
        s("copy"),
        s("--backup-dir"),
        s("../s/kept"),
        o(&src.join("g.txt")),
        o(&dst.join("f.txt")),
    ]);
    r.ok();
    assert_eq!(
        fs::read(src.join("kept/f.txt")).unwrap(),
        b"the old destination"
    );
    assert_eq!(fs::read(src.join("f.txt")).unwrap(), b"the source");
}

/// Over ssh, SRC and DST on one server by another path (a symlink, `..`):
/// compared by device and inode there; refused, nothing changed.
#[test]
fn remote_roots_on_one_server_by_another_path_are_refused() {
    let (rsh, host) = need!(crate::util::ssh::ssh_server());
    let t = tmpdir();
    let src = t.path().join("s");
    sample(&src, "s");
    let ls = ln(t.path(), "link-s", &src);
    let before = snaps(&[&src]);
    let at = |p: &Path| crate::util::ssh::ssh_at(&host, p);
    for (x, y, says) in [
        (at(&src), at(&ls.join("sub")), "inside SRC"),
        (at(&ls.join("sub")), at(&src), "inside DST"),
        (at(&src), at(&t.path().join("link-s")), "same directory"),
    ] {
        for cmd in ["sync", "copy"] {
            let r = crate::util::ssh::ferry_ssh(&rsh, cmd, &[x.clone(), y.clone()]);
            refused(&r, says);
        }
    }
    unchanged(&[&src], &before);
}
