//! Hostile tests: s3_meta (see main.rs). Classes: untrusted remote metadata (an object's
//! `x-amz-meta-mode` and `x-amz-meta-mtime` are whatever anyone who can write to the bucket
//! chose), weak equality (times at two precisions), and a tree shape only S3 can have (an
//! object `a` beside objects `a/...`).

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[allow(unused_imports)]
use crate::util::s3::*;
#[allow(unused_imports)]
use crate::util::*;

/// Upload `body` to the exact key `key` of the server's bucket with another client than
/// ferry (curl, [`curl`]: no ferry metadata), with `meta` (`k=v,k=v`) as user metadata when
/// not empty.
fn put(s3: &S3, key: &str, body: &[u8], meta: &str) {
    let headers: Vec<String> = meta
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("k=v");
            format!("x-amz-meta-{k}: {v}")
        })
        .collect();
    curl(s3, "PUT", key, Some(body), &headers);
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The lines of stderr holding `what`.
fn lines_with(r: &Run, what: &str) -> usize {
    r.err().lines().filter(|l| l.contains(what)).count()
}

const DROPPED: &str = "setuid, setgid and sticky bits of";

/// `mode=104777` in an object's metadata is a planted setuid-root file on the machine that
/// downloads it as root: copy, sync and bisync apply such a mode without its setuid, setgid
/// and sticky bits (one note per run, however many objects), converge (the next run changes
/// nothing), and apply them only when asked (`--keep-special-bits`).
#[test]
fn object_metadata_never_makes_a_setuid_file() {
    each_server(|s3| {
        let url = s3.url("setuid");
        let (_, prefix) = split_url(&url);
        put(
            s3,
            &format!("{prefix}/suid"),
            b"#!/bin/sh\nid\n",
            "mtime=1600000000.5,mode=104777",
        );
        put(
            s3,
            &format!("{prefix}/sgid"),
            b"g",
            "mtime=1600000001,mode=102755",
        );
        put(
            s3,
            &format!("{prefix}/d/sticky"),
            b"s",
            "mtime=1600000002,mode=101777",
        );
        put(
            s3,
            &format!("{prefix}/plain"),
            b"p",
            "mtime=1600000003,mode=100640",
        );
        let t = tmpdir();
        let dst = t.path().join("dst");
        for cmd in ["copy", "sync"] {
            let _ = std::fs::remove_dir_all(&dst);
            let r = s3.run(&[&cmd, &url, &dst]);
            r.ok();
            assert_eq!(mode_of(&dst.join("suid")), 0o777, "{cmd}\n{r}");
            assert_eq!(mode_of(&dst.join("sgid")), 0o755, "{cmd}");
            assert_eq!(mode_of(&dst.join("d/sticky")), 0o777, "{cmd}");
            assert_eq!(mode_of(&dst.join("plain")), 0o640, "{cmd}");
            assert_eq!(lines_with(&r, DROPPED), 1, "one note per run\n{r}");
            // The next run finds everything in sync: nothing to redo.
            let again = s3.run(&[&cmd, &"--json", &url, &dst]);
            again.ok();
            let out = again.out();
            let summary: serde_json::Value =
                serde_json::from_str(out.lines().last().unwrap()).unwrap();
            assert_eq!(summary["files_copied"], 0, "{again}");
            assert!(!out.contains("\"type\":\"meta\""), "{again}");
            assert_eq!(mode_of(&dst.join("suid")), 0o777);
        }
        // A single object too.
        let one = t.path().join("one");
        s3.run(&[&"copy", &format!("{url}/suid"), &one]).ok();
        assert_eq!(mode_of(&one), 0o777);
        // Asked for: applied.
        let kept = t.path().join("kept");
        let r = s3.run(&[&"copy", &"--keep-special-bits", &url, &kept]);
        r.ok();
        assert_eq!(mode_of(&kept.join("suid")), 0o4777);
        assert_eq!(mode_of(&kept.join("sgid")), 0o2755);
        assert_eq!(lines_with(&r, DROPPED), 0, "{r}");
        // A file that had the bits loses them when synced from an object (never gains).
        let r = s3.run(&[&"sync", &url, &kept]);
        r.ok();
        assert_eq!(mode_of(&kept.join("suid")), 0o777, "{r}");

        // bisync: B's object reaches A without the bits, once said; runs converge, and
        // the object keeps its metadata (A did not change).
        let a = t.path().join("a");
        std::fs::create_dir(&a).unwrap();
        let j = t.path().join("j.db");
        let r = s3.run(&[&"bisync", &"--journal", &j, &a, &url]);
        r.ok();
        assert_eq!(mode_of(&a.join("suid")), 0o777, "{r}");
        assert_eq!(mode_of(&a.join("sgid")), 0o755);
        assert_eq!(lines_with(&r, DROPPED), 1, "{r}");
        for _ in 0..2 {
            let r = s3.run(&[&"bisync", &"--json", &"--journal", &j, &a, &url]);
            r.ok();
            let out = r.out();
            let summary: serde_json::Value =
                serde_json::from_str(out.lines().last().unwrap()).unwrap();
            assert_eq!(summary["files_copied"], 0, "converged\n{r}");
            assert_eq!(mode_of(&a.join("suid")), 0o777);
        }
        // A local setuid file uploaded and synced back keeps its bits on A (they are A's own).
        write(&a, "mine", b"m");
        chmod(&a.join("mine"), 0o4750);
        s3.run(&[&"bisync", &"--journal", &j, &a, &url]).ok();
        let r = s3.run(&[&"bisync", &"--json", &"--journal", &j, &a, &url]);
        r.ok();
        assert_eq!(mode_of(&a.join("mine")), 0o4750, "{r}");
        assert!(!r.out().contains("\"type\":\"meta\""), "{r}");
    });
}

/// Metadata that is not an mtime or a mode (text, an octal number too big for a mode, an
/// mtime whose nanoseconds overflow) is ignored with one note per run, never a panic: the
/// object's upload time and mode 0644 are used instead.
#[test]
fn garbage_object_metadata_is_ignored_with_one_note() {
    each_server(|s3| {
        let url = s3.url("garbage-meta");
        let (_, prefix) = split_url(&url);
        put(
            s3,
            &format!("{prefix}/m1"),
            b"1",
            "mtime=1600000000,mode=rwxr-xr-x",
        );
        put(
            s3,
            &format!("{prefix}/m2"),
            b"2",
            "mtime=1600000000,mode=77777777777777777777",
        );
        put(
            s3,
            &format!("{prefix}/t1"),
            b"3",
            "mtime=-9223372036854775808.5",
        );
        put(
            s3,
            &format!("{prefix}/t2"),
            b"4",
            "mtime=99999999999,mode=100600",
        );
        put(s3, &format!("{prefix}/t3"), b"5", "mtime=yesterday");
        let t = tmpdir();
        let dst = t.path().join("dst");
        let r = s3.run(&[&"sync", &url, &dst]);
        r.ok();
        assert_eq!(
            lines_with(&r, "metadata that is not an mtime or a mode"),
            1,
            "{r}"
        );
        assert_eq!(mode_of(&dst.join("m1")), 0o644);
        assert_eq!(mode_of(&dst.join("m2")), 0o644);
        let year_2000 = 946_684_800;
        for f in ["t1", "t2", "t3"] {
            let m = std::fs::metadata(dst.join(f)).unwrap();
            use std::os::unix::fs::MetadataExt;
            assert!(m.mtime() > year_2000, "{f}: the upload time, not garbage");
        }
        // And it converges.
        let again = s3.run(&[&"sync", &"--json", &url, &dst]);
        again.ok();
        let summary: serde_json::Value =
            serde_json::from_str(again.out().lines().last().unwrap()).unwrap();
        assert_eq!(summary["files_copied"], 0, "{again}");
        // ls and bisync read the same metadata: no panic, exit 0.
        s3.run(&[&"ls", &url]).ok();
        let a = t.path().join("a");
        std::fs::create_dir(&a).unwrap();
        let j = t.path().join("j.db");
        s3.run(&[&"bisync", &"--journal", &j, &a, &url]).ok();
        s3.run(&[&"bisync", &"--journal", &j, &a, &url]).ok();
    });
}

/// The body of the object at exactly `key` (fetched by curl, [`curl`]).
fn get(s3: &S3, key: &str) -> Vec<u8> {
    curl(s3, "GET", key, None, &[])
}

/// An object `a` beside objects `a/...` (S3 allows it, no file tree can): bisync syncs the
/// directory `a` both ways as copy and sync do, says once per run that the object is
/// skipped (exit 1), and never touches the object.
#[test]
fn bisync_syncs_below_a_name_that_is_both_an_object_and_a_prefix() {
    each_server(|s3| {
        let url = s3.url("clash");
        let (_, prefix) = split_url(&url);
        put(s3, &format!("{prefix}/a"), b"the object a", "");
        put(s3, &format!("{prefix}/a/b"), b"b below a", "");
        put(s3, &format!("{prefix}/top"), b"top", "");
        let t = tmpdir();
        let a = t.path().join("a");
        std::fs::create_dir(&a).unwrap();
        let j = t.path().join("j.db");
        let clash = "is both an object and a prefix";
        let r = s3.run(&[&"bisync", &"--journal", &j, &a, &url]);
        r.code_is(1);
        assert_eq!(lines_with(&r, clash), 1, "said once\n{r}");
        assert_eq!(std::fs::read(a.join("a/b")).unwrap(), b"b below a", "{r}");
        assert_eq!(std::fs::read(a.join("top")).unwrap(), b"top");
        // A new file below `a` on A goes up; an edit of a/b too.
        write(&a, "a/new", b"new on A");
        let r = s3.run(&[&"bisync", &"--journal", &j, &a, &url]);
        r.code_is(1);
        assert_eq!(lines_with(&r, clash), 1, "{r}");
        assert_eq!(get(s3, &format!("{prefix}/a/new")), b"new on A", "{r}");
        // A later object below `a` comes down.
        put(s3, &format!("{prefix}/a/later"), b"later", "");
        let r = s3.run(&[&"bisync", &"--journal", &j, &a, &url]);
        r.code_is(1);
        assert_eq!(std::fs::read(a.join("a/later")).unwrap(), b"later", "{r}");
        // The object `a` was never touched; nothing else is left to do.
        assert_eq!(get(s3, &format!("{prefix}/a")), b"the object a");
        let r = s3.run(&[&"bisync", &"--json", &"--journal", &j, &a, &url]);
        r.code_is(1);
        let summary: serde_json::Value =
            serde_json::from_str(r.out().lines().last().unwrap()).unwrap();
        assert_eq!(summary["files_copied"], 0, "{r}");
        assert_eq!(summary["errors"], 1, "{r}");
    });
}

/// Objects another tool uploaded (no ferry metadata: their mtime is the upload time, listed to
/// the millisecond by Garage, whole seconds in a HEAD's Last-Modified): bisync replaces and
/// deletes them as any other once A changes them, and converges. Before, the check right
/// before the act compared the two precisions and said "changed during the run; left alone"
/// on every run, forever.
#[test]
fn bisync_converges_with_objects_other_tools_uploaded() {
    each_server(|s3| {
        let url = s3.url("foreign");
        let (_, prefix) = split_url(&url);
        for name in ["x", "y", "z", "d/w"] {
            put(s3, &format!("{prefix}/{name}"), name.as_bytes(), "");
        }
        let t = tmpdir();
        let a = t.path().join("a");
        std::fs::create_dir(&a).unwrap();
        let j = t.path().join("j.db");
        s3.run(&[&"bisync", &"--journal", &j, &a, &url]).ok();
        assert_eq!(std::fs::read(a.join("d/w")).unwrap(), b"d/w");
        // A changes two of them and deletes two: B follows, exit 0.
        write(&a, "x", b"x, edited on A");
        std::fs::write(a.join("y"), b"Y").unwrap(); // same size
        std::fs::remove_file(a.join("z")).unwrap();
        std::fs::remove_file(a.join("d/w")).unwrap();
        let r = s3.run(&[&"bisync", &"--journal", &j, &a, &url]);
        r.ok();
        assert!(!r.err().contains("changed during the run"), "{r}");
        assert_eq!(get(s3, &format!("{prefix}/x")), b"x, edited on A");
        assert_eq!(get(s3, &format!("{prefix}/y")), b"Y");
        let listed = s3.run(&[&"ls", &"--server-mtime", &url]);
        listed.ok();
        assert!(
            !listed.out().contains(" z\n") && !listed.out().contains("d/w"),
            "{listed}"
        );
        // Converged: nothing left to do.
        let r = s3.run(&[&"bisync", &"--json", &"--journal", &j, &a, &url]);
        r.ok();
        let summary: serde_json::Value =
            serde_json::from_str(r.out().lines().last().unwrap()).unwrap();
        assert_eq!(summary["files_copied"], 0, "{r}");
        assert_eq!(summary["files_deleted"], 0, "{r}");
        // A single object copied alone gets the mtime a tree copy gives it (one answer).
        let (tree, one) = (t.path().join("tree"), t.path().join("one"));
        put(s3, &format!("{prefix}/v"), b"v", "");
        s3.run(&[&"copy", &url, &tree]).ok();
        s3.run(&[&"copy", &format!("{url}/v"), &one]).ok();
        assert_eq!(get_mtime(&tree.join("v")), get_mtime(&one));
    });
}

/// The same rule for modes from another host: pulled over SSH (ferry at both ends) and over
/// SFTP, a setuid, setgid or sticky remote file arrives without those bits (one note), and
/// with them under `--keep-special-bits`; pushed from a local tree they stay (the bits are
/// the user's own).
#[test]
fn modes_from_another_host_lose_their_special_bits() {
    use crate::util::ssh::*;
    let (rsh, host) = need!(ssh_server());
    let t = tmpdir();
    let remote = t.path().join("remote");
    write(&remote, "suid", b"s");
    chmod(&remote.join("suid"), 0o4755);
    write(&remote, "d/sgid", b"g");
    chmod(&remote.join("d/sgid"), 0o2750);
    for how in ["ssh", "sftp"] {
        let dst = t.path().join(format!("pulled-{how}"));
        let mut args: Vec<OsString> = vec![ssh_at(&host, &remote), dst.clone().into()];
        if how == "sftp" {
            args.insert(0, "--sftp".into());
        }
        let r = ferry_ssh(&rsh, "copy", &args);
        r.ok();
        assert_eq!(mode_of(&dst.join("suid")), 0o755, "{how}\n{r}");
        assert_eq!(mode_of(&dst.join("d/sgid")), 0o750, "{how}");
        assert_eq!(lines_with(&r, DROPPED), 1, "{how}\n{r}");
        let kept = t.path().join(format!("kept-{how}"));
        let mut args: Vec<OsString> = vec![
            "--keep-special-bits".into(),
            ssh_at(&host, &remote),
            kept.clone().into(),
        ];
        if how == "sftp" {
            args.insert(0, "--sftp".into());
        }
        ferry_ssh(&rsh, "copy", &args).ok();
        assert_eq!(mode_of(&kept.join("suid")), 0o4755, "{how}");
    }
    // Pushed from a local tree: the bits are kept there.
    let pushed = t.path().join("pushed");
    let r = ferry_ssh(
        &rsh,
        "copy",
        &[remote.clone().into(), ssh_at(&host, &pushed)],
    );
    r.ok();
    assert_eq!(mode_of(&pushed.join("suid")), 0o4755, "{r}");
    assert_eq!(lines_with(&r, DROPPED), 0, "{r}");
}
