//! What S3 paths mean (docs/CLI.md, "Arguments" and "S3"): missing
//! prefixes, single objects, keys no file path can hold, an object beside a
//! prefix of its name, empty directories, directory modes after a kill, and
//! JSON records that add up to the summary. Against the server of
//! `crate::util::s3` (Garage under `scripts/test`; any S3 server through the
//! `FERRY_TEST_S3_*` variables).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::util::s3::*;
use crate::util::*;

/// Upload `body` to the exact key `key` with the AWS CLI (`s3api put-object` sends the key
/// as it is, whatever its segments), asserted to succeed.
fn aws_put(s3: &S3, key: &str, body: &[u8]) {
    let t = tmpdir();
    let f = write(t.path(), "body", body);
    let f = f.to_str().expect("a UTF-8 temporary path");
    aws(
        s3,
        &[
            "s3api",
            "put-object",
            "--bucket",
            &s3.bucket,
            "--key",
            key,
            "--body",
            f,
        ],
    );
}

/// The paths listed by `ferry ls URL` (directories end with `/`), sorted.
fn ls_paths(url: &str) -> Vec<String> {
    let r = run(&[&"ls", &"--server-mtime", &url]);
    r.ok();
    let mut v: Vec<String> = r
        .out()
        .lines()
        .map(|l| l.splitn(3, ' ').nth(2).unwrap().to_string())
        .collect();
    v.sort();
    v
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_missing_prefix_as_src_is_refused_not_mirrored() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "a/f", b"f");
    write(&src, "g", b"g");
    let url = s3.url("missing");
    run(&[&"sync", &src, &url]).ok();
    let dst = t.path().join("dst");
    run(&[&"sync", &url, &dst]).ok();
    let before = snapshot(&dst);

    // A typo: no object under it. Nothing deleted, exit 2, one line naming it.
    let typo = format!("{url}-typo");
    for r in [
        run(&[&"sync", &typo, &dst]),
        run(&[&"sync", &"--dry-run", &typo, &dst]),
        run(&[&"copy", &typo, &dst]),
    ] {
        r.code_is(2);
        assert_eq!(
            r.err().trim_end(),
            format!("ferry: SRC {typo}: no such prefix (no objects; --force to take it as empty)"),
            "{r}"
        );
    }
    // With a trailing slash too.
    let r = run(&[&"sync", &format!("{typo}/"), &dst]);
    r.code_is(2);
    assert_untouched(&before, &snapshot(&dst));
    // To S3 as well: the destination prefix keeps its objects.
    let other = s3.url("missing-other");
    run(&[&"copy", &src, &other]).ok();
    run(&[&"sync", &typo, &other]).code_is(2);
    assert_eq!(ls_paths(&other), ["a/", "a/f", "g"]);

    // --force: taken as an empty tree.
    let r = run(&[&"sync", &"--force", &"--json", &typo, &dst]);
    r.ok();
    assert!(walk(&dst).is_empty(), "{r}");

    // A missing bucket: exit 2, as SRC and as DST.
    let r = run(&[&"sync", &"s3://no-such-bucket-ferry/x", &dst]);
    r.code_is(2);
    assert!(r.err().contains("no such bucket"), "{r}");
    let r = run(&[&"copy", &src.join("g"), &"s3://no-such-bucket-ferry/x"]);
    r.code_is(2);
}

#[test]
fn single_objects_copy_both_ways_and_between_buckets() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    // Multipart-sized (resumable, ranged download) and small.
    let big = write(&src, "big.bin", &gen_bytes(17 * 1024 * 1024 + 3, 7));
    let small = write(&src, "small.txt", b"small");
    chmod(&big, 0o640);
    chmod(&small, 0o600);
    set_mtime(&big, (1_500_000_000, 123_456_789));
    set_mtime(&small, (1_500_000_001, 5));
    let url = s3.url("one");

    // A file to the key DST names; to a prefix ending in `/` under its own name.
    let r = run(&[&"copy", &"--json", &big, &format!("{url}/d/big-key.bin")]);
    r.ok();
    assert_eq!(summary(&r).files_copied, 1, "{r}");
    run(&[&"copy", &small, &format!("{url}/d/")]).ok();
    assert_eq!(
        ls_paths(&url),
        ["d/", "d/big-key.bin", "d/small.txt"],
        "keys of single-file uploads"
    );
    // Again: unchanged (size and mtime kept in the object's metadata).
    let r = run(&[&"copy", &"--json", &big, &format!("{url}/d/big-key.bin")]);
    r.ok();
    assert_eq!(
        (summary(&r).files_copied, summary(&r).unchanged),
        (0, 1),
        "{r}"
    );

    // An object to a file path: a file, not a directory, with mtime and mode.
    let out = t.path().join("out.bin");
    let r = run(&[&"copy", &"--json", &format!("{url}/d/big-key.bin"), &out]);
    r.ok();
    assert!(out.is_file(), "{r}");
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&big).unwrap());
    assert_eq!(get_mtime(&out), (1_500_000_000, 123_456_789));
    assert_eq!(mode_of(&out), 0o640);
    let r = run(&[&"sync", &"--json", &format!("{url}/d/big-key.bin"), &out]);
    r.ok();
    assert_eq!(summary(&r).files_copied, 0, "{r}");

    // Into an existing directory, or a path ending in `/`: under the key's name.
    let dir = t.path().join("dir");
    std::fs::create_dir(&dir).unwrap();
    run(&[&"copy", &format!("{url}/d/small.txt"), &dir]).ok();
    let slash = format!("{}/", dir.display());
    run(&[&"copy", &format!("{url}/d/big-key.bin"), &slash]).ok();
    assert_eq!(std::fs::read(dir.join("small.txt")).unwrap(), b"small");
    assert_eq!(get_mtime(&dir.join("small.txt")), (1_500_000_001, 5));
    assert_eq!(mode_of(&dir.join("small.txt")), 0o600);
    assert!(dir.join("big-key.bin").is_file());
    // A missing directory named with `/`: refused, nothing made.
    let r = run(&[
        &"copy",
        &format!("{url}/d/small.txt"),
        &t.path().join("nodir/"),
    ]);
    r.code_is(2);
    assert!(!t.path().join("nodir").exists());

    // --checksum on a single object: same size and mtime, other bytes.
    rewrite_keep_meta(&dir.join("small.txt"), b"SMALL");
    let r = run(&[&"copy", &"--json", &format!("{url}/d/small.txt"), &dir]);
    assert_eq!(summary(&r).files_copied, 0, "{r}");
    let r = run(&[
        &"copy",
        &"--json",
        &"-c",
        &format!("{url}/d/small.txt"),
        &dir,
    ]);
    assert_eq!(summary(&r).files_copied, 1, "{r}");
    assert_eq!(std::fs::read(dir.join("small.txt")).unwrap(), b"small");

    // S3 to S3: one object, copied on the server, metadata kept.
    let other = s3.url("one-copy");
    let r = run(&[
        &"copy",
        &"-v",
        &format!("{url}/d/big-key.bin"),
        &format!("{other}/"),
    ]);
    r.ok();
    assert!(r.err().contains(" 1 server-side copies"), "{r}");
    let back = t.path().join("back.bin");
    run(&[&"copy", &format!("{other}/big-key.bin"), &back]).ok();
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&big).unwrap());
    assert_eq!(get_mtime(&back), (1_500_000_000, 123_456_789));
    assert_eq!(mode_of(&back), 0o640);

    // A DST key that is a prefix already is a directory: into it.
    run(&[&"copy", &small, &format!("{url}/d")]).ok();
    assert_eq!(ls_paths(&url), ["d/", "d/big-key.bin", "d/small.txt"]);
}

#[test]
fn an_object_that_is_also_a_prefix() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let url = s3.url("both");
    let (_, prefix) = split_url(&url);
    aws_put(&s3, &format!("{prefix}/p/a"), b"the object a");
    aws_put(&s3, &format!("{prefix}/p/a/b"), b"the object a/b");
    aws_put(&s3, &format!("{prefix}/p/c"), b"c");
    let want_line = format!(
        "ferry: a: is both an object and a prefix ({url}/p/a and {url}/p/a/...): skipped the object"
    );

    // sync: one clear line per run, exit 1, the rest done.
    let dst = t.path().join("dst");
    for _ in 0..2 {
        let r = run(&[&"sync", &format!("{url}/p"), &dst]);
        r.code_is(1);
        assert_eq!(r.error_lines(), std::slice::from_ref(&want_line), "{r}");
        assert_eq!(std::fs::read(dst.join("a/b")).unwrap(), b"the object a/b");
        assert_eq!(std::fs::read(dst.join("c")).unwrap(), b"c");
    }
    // ls: the same line, the prefix listed, not the object.
    let r = run(&[&"ls", &"--server-mtime", &format!("{url}/p")]);
    r.code_is(1);
    assert_eq!(r.error_lines(), [want_line], "{r}");
    assert_eq!(r.out().lines().count(), 3, "a/, a/b, c: {r}");

    // The URL of the key itself names the object (with a note); with `/` the prefix.
    let one = t.path().join("one");
    let r = run(&[&"copy", &format!("{url}/p/a"), &one]);
    r.ok();
    assert!(r.err().contains("is both an object and a prefix"), "{r}");
    assert_eq!(std::fs::read(&one).unwrap(), b"the object a");
    let tree = t.path().join("tree");
    run(&[&"copy", &format!("{url}/p/a/"), &tree]).ok();
    assert_eq!(std::fs::read(tree.join("b")).unwrap(), b"the object a/b");
}

#[test]
fn keys_no_path_can_hold_are_reported_once_never_fetched_elsewhere() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let url = s3.url("trav");
    let (bucket, prefix) = split_url(&url);
    let bad = [
        format!("{prefix}/trav/.."),
        format!("{prefix}/trav/./x"),
        format!("{prefix}/a//b"),
        format!("{prefix}//lead"),
    ];
    for k in &bad {
        aws_put(&s3, k, format!("object {k}").as_bytes());
    }
    aws_put(&s3, &format!("{prefix}/trav/ok"), b"ok");
    aws_put(&s3, &format!("{prefix}/a/c"), b"c");

    let want = |root: &str| {
        let mut v = vec![
            format!("ferry: {root}trav/..: the key s3://{bucket}/{prefix}/trav/.. has a \"..\" segment, which no file path can hold: skipped"),
            format!("ferry: {root}trav/./: the keys under s3://{bucket}/{prefix}/trav/./ have a \".\" segment, which no file path can hold: skipped"),
            format!("ferry: {root}a//: the keys under s3://{bucket}/{prefix}/a// have an empty segment, which no file path can hold: skipped"),
        ];
        v.sort();
        v
    };
    let dst = t.path().join("dst");
    for _ in 0..2 {
        let r = run(&[&"sync", &url, &dst]);
        r.code_is(1);
        let mut lines = r.error_lines();
        lines.sort();
        // `//lead` is the key `{prefix}//lead`: under the root, a prefix `/`.
        let mut w = want("");
        w.push(format!("ferry: /: the keys under s3://{bucket}/{prefix}// have an empty segment, which no file path can hold: skipped"));
        w.sort();
        assert_eq!(lines, w, "{r}");
        // Only the keys' own files: nothing written outside DST, no listing as a file.
        assert_eq!(
            walk(&dst),
            ["a", "a/c", "trav", "trav/ok"].map(std::path::PathBuf::from),
            "{r}"
        );
        assert_eq!(std::fs::read(dst.join("trav/ok")).unwrap(), b"ok");
    }
    assert!(!t.path().join("trav").exists() && !t.path().join("x").exists());
    // ls says so too.
    let r = run(&[&"ls", &format!("{url}/trav")]);
    r.code_is(1);
    assert_eq!(r.error_lines().len(), 2, "{r}");
    // A URL with a dot segment cannot be requested exactly: refused.
    let r = run(&[&"copy", &format!("{url}/trav/.."), &t.path().join("x")]);
    r.code_is(2);
    assert!(r.err().contains("segment"), "{r}");
}

#[test]
fn empty_directories_to_s3_are_a_note_not_a_mkdir_every_run() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "f", b"f");
    write(&src, "full/g", b"g");
    mkdirs(&src, "empty");
    mkdirs(&src, "outer/inner");
    let url = s3.url("emptydirs");
    for _ in 0..2 {
        let r = run(&[&"sync", &"--json", &src, &url]);
        r.ok();
        let s = summary(&r);
        assert_eq!(s.dirs_created, 0, "{r}");
        let acts = actions(&r);
        assert!(!acts.iter().any(|(ty, _)| ty == "mkdir"), "{r}");
        let mut skipped: Vec<&str> = acts
            .iter()
            .filter(|(ty, _)| ty == "skip")
            .map(|(_, p)| p.as_str())
            .collect();
        skipped.sort();
        assert_eq!(skipped, ["empty", "outer/inner"], "{r}");
        assert!(
            r.err()
                .contains("ferry: skipped empty (empty directory: the destination keeps no empty directories)"),
            "{r}"
        );
    }
    // A no-op run prints nothing but the notes and the summary.
    let r = run(&[&"sync", &"-v", &src, &url]);
    r.ok();
    assert!(!r.out().contains("mkdir"), "{r}");
}

#[test]
fn json_records_add_up_to_the_summary_and_deletes_carry_sizes() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "keep", b"keep");
    write(&src, "gone1", &[1u8; 1234]);
    write(&src, "tree/x", &[2u8; 100]);
    write(&src, "tree/sub/y", &[3u8; 7]);
    let url = s3.url("records");
    run(&[&"sync", &src, &url]).ok();
    let dst = t.path().join("dst");
    run(&[&"sync", &url, &dst]).ok();
    std::fs::remove_file(src.join("gone1")).unwrap();
    std::fs::remove_dir_all(src.join("tree")).unwrap();
    write(&src, "new/z", b"zz");
    write(&src, "keep", b"changed");
    stamp_tree(&src, 1_600_000_000);

    let check = |r: &Run, want_deleted: &[(&str, u64)]| {
        let recs = json_lines(r);
        let count = |ty: &str| {
            recs.iter()
                .filter(|j| j.str_field("type") == Some(ty))
                .count() as u64
        };
        let s = summary(r);
        assert_eq!(
            count("copy") + count("update") + count("symlink"),
            s.files_copied,
            "{r}"
        );
        assert_eq!(count("delete"), s.files_deleted, "{r}");
        assert_eq!(count("mkdir"), s.dirs_created, "{r}");
        assert_eq!(count("error"), s.errors, "{r}");
        let mut deleted: Vec<(String, u64)> = recs
            .iter()
            .filter(|j| j.str_field("type") == Some("delete"))
            .map(|j| {
                (
                    j.str_field("path").unwrap().to_string(),
                    j.get("size").and_then(Json::as_u64).unwrap(),
                )
            })
            .collect();
        deleted.sort();
        let mut want: Vec<(String, u64)> = want_deleted
            .iter()
            .map(|(p, n)| (p.to_string(), *n))
            .collect();
        want.sort();
        assert_eq!(deleted, want, "{r}");
    };
    let tree_deleted = [
        ("gone1", 1234),
        ("tree", 0),
        ("tree/x", 100),
        ("tree/sub/y", 7),
    ];
    // Up: copies, an update, deletes of a file and of a tree of objects.
    let r = run(&[&"sync", &"--json", &src, &url]);
    r.ok();
    assert_eq!(summary(&r).files_copied, 2, "{r}");
    check(&r, &tree_deleted);
    // Down: the same to a local tree, with a mkdir (`new`).
    let r = run(&[&"sync", &"--json", &url, &dst]);
    r.ok();
    assert_eq!(summary(&r).dirs_created, 1, "{r}");
    let mut local_deleted = tree_deleted.to_vec();
    local_deleted.push(("tree/sub", 0));
    check(&r, &local_deleted);
}

#[test]
fn directory_modes_converge_after_a_killed_download() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    for i in 0..40 {
        write(&src, format!("d{}/e/f{i}", i % 4), &gen_bytes(2000, i));
    }
    stamp_tree(&src, 1_500_000_000);
    let url = s3.url("dirmodes");
    run(&[&"sync", &src, &url]).ok();
    let dst = t.path().join("dst");
    run(&[&"sync", &url, &dst]).ok();
    for d in ["d0", "d1", "d1/e", "d3/e"] {
        assert_eq!(mode_of(&dst.join(d)), 0o755, "{d}");
    }
    // What a kill leaves: directories still 0700 (made so to fill them).
    chmod(&dst.join("d1"), 0o700);
    chmod(&dst.join("d2/e"), 0o700);
    let r = run(&[&"sync", &"--json", &url, &dst]);
    r.ok();
    assert_eq!(summary(&r).files_copied, 0, "{r}");
    for d in ["d1", "d2/e"] {
        assert_eq!(mode_of(&dst.join(d)), 0o755, "{d} after the rerun");
    }
    assert_files_equal(&src, &dst);

    // A real kill, mid-download: the rerun completes files and directory modes.
    let dst2 = t.path().join("dst2");
    let args: [&std::ffi::OsStr; 5] = [
        "sync".as_ref(),
        "-j".as_ref(),
        "1".as_ref(),
        url.as_ref(),
        dst2.as_os_str(),
    ];
    let mut child = spawn_ferry(args);
    // Until it has made a directory, then kill -9.
    while !dst2.join("d0").exists() {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    run(&[&"sync", &url, &dst2]).ok();
    assert_files_equal(&src, &dst2);
    for d in ["", "d0", "d0/e", "d1", "d2", "d3", "d3/e"] {
        assert_eq!(mode_of(&dst2.join(d)), 0o755, "{d:?} after kill and rerun");
    }
}

#[test]
fn ls_of_a_single_object_and_of_a_missing_prefix() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let f = write(t.path(), "one.txt", b"12345");
    chmod(&f, 0o640);
    set_mtime(&f, (1_500_000_000, 7));
    let url = s3.url("lsone");
    run(&[&"copy", &f, &format!("{url}/d/one.txt")]).ok();
    // The object, as `ls FILE` lists a file: one line, its size and mtime.
    let r = run(&[&"ls", &format!("{url}/d/one.txt")]);
    r.ok();
    assert_eq!(
        r.out(),
        format!("5 1500000000000000007 {url}/d/one.txt\n"),
        "{r}"
    );
    let r = run(&[&"ls", &"--json", &format!("{url}/d/one.txt")]);
    r.ok();
    assert!(
        r.out().contains("\"size\":5") && r.out().contains("\"mode\":416"),
        "{r}"
    );
    // A name that is neither an object nor a prefix: an empty listing.
    let r = run(&[&"ls", &format!("{url}/d/typo")]);
    r.ok();
    assert_eq!(r.out(), "", "{r}");
    // A prefix is listed as a tree, with or without its slash.
    for u in [format!("{url}/d"), format!("{url}/d/")] {
        let r = run(&[&"ls", &u]);
        r.ok();
        assert!(r.out().ends_with(" one.txt\n"), "{r}");
    }
}
