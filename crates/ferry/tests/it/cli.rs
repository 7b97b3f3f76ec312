//! Black-box tests of the `ferry` command line against docs/CLI.md.
//!
//! (Over 800 lines: one test per rule of docs/CLI.md; the list is as long as the contract.)

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::util::*;

/// A small representative tree: files of several sizes, nested and empty dirs, a symlink,
/// distinct nanosecond mtimes everywhere.
fn sample(root: &Path) {
    fs::create_dir_all(root).unwrap();
    write(root, "a.txt", b"hello ferry\n");
    write(root, "empty", b"");
    write(root, "b.bin", &gen_bytes(70_000, 1));
    write(root, "d1/c.txt", b"c");
    write(root, "d1/d2/deep.bin", &gen_bytes(4096, 2));
    mkdirs(root, "d1/empty_dir");
    mkdirs(root, "d3");
    ln(root, "d1/link", "../a.txt");
    stamp_tree(root, 1_500_000_000);
}

fn src_dst() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tmpdir();
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    sample(&src);
    (t, src, dst)
}

/// Assert a usage/configuration error: exit 2, a message on stderr, SRC untouched and
/// `dst` (if given) not created.
#[track_caller]
fn usage_error(args: &[&std::ffi::OsStr], watch: &[&Path], must_not_exist: Option<&Path>) {
    let before: Vec<Snapshot> = watch.iter().map(|p| snapshot(p)).collect();
    let r = ferry(args);
    r.code_is(2);
    assert!(
        !r.err().trim().is_empty(),
        "exit 2 without a message on stderr\n{r}"
    );
    for (p, b) in watch.iter().zip(before) {
        assert_untouched(&b, &snapshot(p));
    }
    if let Some(p) = must_not_exist {
        assert!(
            fs::symlink_metadata(p).is_err(),
            "{} was created\n{r}",
            p.display()
        );
    }
}

fn o(p: &Path) -> &std::ffi::OsStr {
    p.as_os_str()
}

fn s(x: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(x)
}

// ------------------------------------------------------------------------------------------
// Exit code 2: usage and configuration errors
// ------------------------------------------------------------------------------------------

#[test]
fn missing_src_exits_2() {
    let t = tmpdir();
    let src = t.path().join("nope");
    let dst = t.path().join("dst");
    for cmd in ["copy", "sync"] {
        usage_error(&[s(cmd), o(&src), o(&dst)], &[t.path()], Some(&dst));
    }
}

#[test]
fn remote_shell_locations_go_to_ssh_and_sftp() {
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "f", b"x");
    let dst = t.path().join("dst");
    let (src, dst) = (src.to_str().unwrap(), dst.to_str().unwrap());
    // rsync's host:path (and ssh://, sftp://) run the -e command: one that
    // cannot run is one line, exit 2, nothing done.
    let rsh = "/nonexistent-ferry-test/ssh -x";
    for args in [
        vec!["copy", "-e", rsh, "host:dir", dst],
        vec!["sync", "-e", rsh, src, "user@host:dir"],
        vec!["copy", "-e", rsh, src, "ssh://host:2222/dir"],
        vec!["ls", "-e", rsh, "C:"],
        vec!["bisync", "-e", rsh, src, "[::1]:dir"],
        vec!["copy", "-e", rsh, src, "sftp://host/dir"],
        vec!["copy", "--sftp", "-e", rsh, src, "host:dir"],
    ] {
        let r = ferry(&args);
        r.code_is(2);
        assert!(
            r.err()
                .contains("cannot run \"/nonexistent-ferry-test/ssh\""),
            "{args:?}\n{r}"
        );
        assert!(r.err().lines().count() == 1, "{args:?}\n{r}");
    }
    assert!(!Path::new(dst).exists());
    // A ':' after a '/' is a local name.
    let colon = t.path().join("a:b");
    let r = ferry([s("copy"), s(src), o(&colon)]);
    r.code_is(0);
    assert_eq!(fs::read(colon.join("f")).unwrap(), b"x");
}

#[test]
fn dangling_src_symlink_exits_2() {
    let t = tmpdir();
    let src = ln(t.path(), "src", "does-not-exist");
    let dst = t.path().join("dst");
    for cmd in ["copy", "sync"] {
        usage_error(&[s(cmd), o(&src), o(&dst)], &[t.path()], Some(&dst));
    }
}

#[test]
fn dst_inside_src_exits_2() {
    let (_t, src, _) = src_dst();
    let new_inside = src.join("newsub");
    let existing_inside = src.join("d1");
    let deep_inside = src.join("d1/d2/x");
    for cmd in ["copy", "sync"] {
        usage_error(
            &[s(cmd), o(&src), o(&new_inside)],
            &[&src],
            Some(&new_inside),
        );
        usage_error(&[s(cmd), o(&src), o(&existing_inside)], &[&src], None);
        usage_error(
            &[s(cmd), o(&src), o(&deep_inside)],
            &[&src],
            Some(&deep_inside),
        );
        // trailing slash on SRC changes nothing
        let src_slash = format!("{}/", src.display());
        usage_error(
            &[s(cmd), s(&src_slash), o(&new_inside)],
            &[&src],
            Some(&new_inside),
        );
    }
}

#[test]
fn dst_equal_to_src_exits_2() {
    let (_t, src, _) = src_dst();
    let spellings = [
        format!("{}", src.display()),
        format!("{}/", src.display()),
        format!("{}/.", src.display()),
        format!("{}/d1/..", src.display()),
        format!("{}/./", src.display()),
    ];
    for cmd in ["copy", "sync"] {
        for d in &spellings {
            usage_error(&[s(cmd), o(&src), s(d)], &[&src], None);
        }
    }
}

#[test]
fn src_inside_dst_exits_2() {
    let t = tmpdir();
    let dst = t.path().join("dst");
    fs::create_dir(&dst).unwrap();
    write(&dst, "keep.txt", b"keep");
    let src = dst.join("inner");
    sample(&src);
    for cmd in ["copy", "sync"] {
        usage_error(&[s(cmd), o(&src), o(&dst)], &[&dst], None);
        let deeper = src.join("d1");
        usage_error(&[s(cmd), o(&deeper), o(&dst)], &[&dst], None);
    }
}

#[test]
fn src_dir_and_dst_existing_file_exits_2() {
    let (t, src, _) = src_dst();
    let dst = write(t.path(), "dstfile", b"i am a file");
    for cmd in ["copy", "sync"] {
        usage_error(&[s(cmd), o(&src), o(&dst)], &[&src, &dst], None);
    }
}

#[test]
fn src_file_and_dst_existing_dir_exits_2() {
    let t = tmpdir();
    let src = write(t.path(), "f.txt", b"content");
    let dst = mkdirs(t.path(), "dstdir");
    write(&dst, "other", b"x");
    for cmd in ["copy", "sync"] {
        usage_error(
            &[s(cmd), o(&src), o(&dst)],
            &[&src, &dst],
            Some(&dst.join("f.txt")),
        );
    }
}

#[test]
fn dst_parent_missing_exits_2() {
    let (t, src, _) = src_dst();
    let dst = t.path().join("no/such/parent/dst");
    let file = src.join("a.txt");
    for cmd in ["copy", "sync"] {
        usage_error(&[s(cmd), o(&src), o(&dst)], &[t.path()], None);
        usage_error(&[s(cmd), o(&file), o(&dst)], &[t.path()], None);
    }
}

#[test]
fn bad_usage_exits_2() {
    let (t, src, dst) = src_dst();
    let watch = [t.path()];
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec!["frobnicate"],
        vec!["copy"],
        vec!["sync"],
        vec!["copy", "onlyone"],
        vec!["copy", "--bogus-flag"],
        vec!["sync", "--bogus-flag"],
        vec!["copy", "-j"],
        vec!["copy", "--exclude"],
        vec!["copy", "--exclude-from"],
        vec!["copy", "--jobs", "abc"],
        vec!["copy", "--jobs", "-3"],
        vec!["sync", "-j", "many"],
    ];
    for c in cases {
        let mut args: Vec<OsString> = c.iter().map(OsString::from).collect();
        // complete the commands that need SRC DST so the error is really the flag
        if c.len() >= 2 && c[0] != "frobnicate" && c[1] != "onlyone" {
            args.push(src.clone().into());
            args.push(dst.clone().into());
        }
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        usage_error(&refs, &watch, Some(&dst));
    }
    // unknown option after the paths, too
    usage_error(
        &[s("copy"), o(&src), o(&dst), s("--nope")],
        &watch,
        Some(&dst),
    );
    // ls without a path / with a bad flag
    usage_error(&[s("ls")], &watch, None);
    usage_error(&[s("ls"), s("--bogus"), o(&src)], &watch, None);
}

#[test]
fn exclude_from_missing_file_exits_2() {
    let (t, src, dst) = src_dst();
    let missing = t.path().join("no-such-ignore-file");
    for cmd in ["copy", "sync"] {
        usage_error(
            &[s(cmd), s("--exclude-from"), o(&missing), o(&src), o(&dst)],
            &[t.path()],
            Some(&dst),
        );
    }
    // a directory is not a readable ignore file either
    let dir = mkdirs(t.path(), "ignoredir");
    usage_error(
        &[s("sync"), s("--exclude-from"), o(&dir), o(&src), o(&dst)],
        &[t.path()],
        Some(&dst),
    );
}

#[test]
fn name_prefix_is_not_inside() {
    // DST "src2" / "src.bak" is a sibling of "src", not inside it.
    let (t, src, _) = src_dst();
    for name in ["src2", "src.bak", "sr"] {
        let dst = t.path().join(name);
        run_on("sync", &src, &dst, &[]).ok();
        assert_trees_equal(&src, &dst);
    }
}

// ------------------------------------------------------------------------------------------
// SRC and DST shapes
// ------------------------------------------------------------------------------------------

#[test]
fn copy_and_sync_into_missing_dst() {
    for cmd in ["copy", "sync"] {
        let (_t, src, dst) = src_dst();
        assert!(!dst.exists());
        run_on(cmd, &src, &dst, &[]).ok();
        assert_trees_equal(&src, &dst);
    }
}

#[test]
fn copy_into_existing_empty_dst() {
    let (_t, src, dst) = src_dst();
    fs::create_dir(&dst).unwrap();
    chmod(&dst, 0o700);
    set_mtime(&dst, (1_000_000_000, 5));
    run_on("copy", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
}

#[test]
fn trailing_slash_never_changes_meaning() {
    let (t, src, _) = src_dst();
    let forms = [
        (
            format!("{}/", src.display()),
            t.path().join("o1").display().to_string(),
        ),
        (
            format!("{}", src.display()),
            format!("{}/", t.path().join("o2").display()),
        ),
        (
            format!("{}/", src.display()),
            format!("{}/", t.path().join("o3").display()),
        ),
    ];
    for (sarg, darg) in &forms {
        for cmd in ["copy", "sync"] {
            ferry([cmd, sarg.as_str(), darg.as_str()]).ok();
            let d = Path::new(darg.trim_end_matches('/'));
            assert!(
                !d.join("src").exists(),
                "{cmd} {sarg} {darg} nested SRC inside DST"
            );
            assert_trees_equal(&src, d);
        }
    }
}

#[test]
fn file_src_to_file_dst() {
    for cmd in ["copy", "sync"] {
        let t = tmpdir();
        let src = write(t.path(), "in.bin", &gen_bytes(100_003, 7));
        chmod(&src, 0o640);
        set_mtime(&src, (1_600_000_000, 987_654_321));
        let dst = t.path().join("out.bin");
        run_on(cmd, &src, &dst, &[]).ok();
        assert_trees_equal(&src, &dst);

        // an existing different DST file is replaced
        write(t.path(), "out.bin", b"old and different");
        run_on(cmd, &src, &dst, &[]).ok();
        assert_trees_equal(&src, &dst);

        // rerun: nothing to do, file not rewritten
        let before = snapshot(&dst);
        run_on(cmd, &src, &dst, &[]).ok();
        assert_untouched(&before, &snapshot(&dst));
    }
}

#[test]
fn src_symlink_is_followed() {
    let t = tmpdir();
    let real = t.path().join("real");
    sample(&real);
    let link = ln(t.path(), "srclink", &real);
    let dst = t.path().join("dst");
    run_on("sync", &link, &dst, &[]).ok();
    assert!(!fs::symlink_metadata(&dst).unwrap().file_type().is_symlink());
    assert_trees_equal(&real, &dst);

    let realf = real.join("b.bin");
    let linkf = ln(t.path(), "filelink", &realf);
    let dstf = t.path().join("dst.bin");
    run_on("copy", &linkf, &dstf, &[]).ok();
    assert!(fs::symlink_metadata(&dstf).unwrap().is_file());
    assert_trees_equal(&realf, &dstf);
}

// ------------------------------------------------------------------------------------------
// copy vs sync: deletion
// ------------------------------------------------------------------------------------------

fn add_extras(dst: &Path) {
    write(dst, "extra.txt", b"extra");
    write(dst, "d1/extra2.txt", b"extra2");
    write(dst, "xdir/inner/f", b"deep extra");
    ln(dst, "xlink", "nowhere");
}

#[test]
fn copy_never_deletes() {
    let (_t, src, dst) = src_dst();
    run_on("copy", &src, &dst, &[]).ok();
    add_extras(&dst);
    let extras: Vec<PathBuf> = [
        "extra.txt",
        "d1/extra2.txt",
        "xdir/inner/f",
        "xdir",
        "xlink",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let before = snapshot(&dst);
    run_on("copy", &src, &dst, &[]).ok();
    let after = snapshot(&dst);
    for e in &extras {
        assert_eq!(
            before.get(e),
            after.get(e),
            "copy changed extra entry {e:?}"
        );
    }
    assert_tree_contains(&dst, &src);
}

#[test]
fn sync_deletes_extras() {
    let (_t, src, dst) = src_dst();
    run_on("copy", &src, &dst, &[]).ok();
    add_extras(&dst);
    run_on("sync", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
}

#[test]
fn sync_never_deletes_outside_dst() {
    let (t, src, dst) = src_dst();
    let outside = t.path().join("outside");
    write(&outside, "precious.txt", b"do not delete");
    write(&outside, "sub/also.txt", b"nor this");
    let sibling = write(t.path(), "sibling.txt", b"sibling");
    fs::create_dir(&dst).unwrap();
    ln(&dst, "abs_out", &outside); // SRC lacks it: delete the link only
    ln(&dst, "rel_out", "../sibling.txt");
    ln(&dst, "d3", &outside); // SRC has a dir d3: replace the link, do not write through it
    ln(&dst, "a.txt", &sibling); // SRC has a file a.txt: replace the link
    let outside_before = snapshot(&outside);
    let sibling_before = snapshot(&sibling);
    run_on("sync", &src, &dst, &[]).ok();
    assert_same_content(&outside_before, &snapshot(&outside));
    assert_same_content(&sibling_before, &snapshot(&sibling));
    assert_trees_equal(&src, &dst);
}

#[test]
fn replacing_a_file_does_not_write_through_hard_links() {
    // "replaced atomically": the new content goes to a new inode, so another hard link to the
    // old DST file (outside DST) keeps the old content.
    for cmd in ["copy", "sync"] {
        let (t, src, dst) = src_dst();
        run_on(cmd, &src, &dst, &[]).ok();
        let outside = t.path().join("hardlink");
        fs::hard_link(dst.join("a.txt"), &outside).unwrap();
        let before = snapshot(&outside);
        write(&src, "a.txt", b"new content of different length");
        set_mtime(&src.join("a.txt"), (1_700_000_000, 1));
        stamp_tree(&src, 1_500_000_000);
        run_on(cmd, &src, &dst, &[]).ok();
        assert_trees_equal(&src, &dst);
        let after = snapshot(&outside);
        assert_eq!(
            before[Path::new("")].hash,
            after[Path::new("")].hash,
            "{cmd} wrote through a hard link"
        );
    }
}

#[test]
fn copy_replaces_file_and_symlink_counterparts() {
    let (_t, src, dst) = src_dst();
    fs::create_dir(&dst).unwrap();
    ln(&dst, "a.txt", "somewhere"); // DST symlink, SRC file
    write(&dst, "d1/link", b"a file where SRC has a symlink");
    write(&dst, "b.bin", b"short"); // different file
    run_on("copy", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
}

// ------------------------------------------------------------------------------------------
// --dry-run
// ------------------------------------------------------------------------------------------

/// SRC and DST that differ in every possible way.
fn divergent() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (t, src, dst) = src_dst();
    run_on("copy", &src, &dst, &[]).ok();
    write(&src, "new.txt", b"new file");
    write(&src, "newdir/inner.txt", b"inner");
    write(&src, "a.txt", b"changed content, other size");
    stamp_tree(&src, 1_600_000_000);
    write(&dst, "extra.txt", b"extra");
    write(&dst, ".ferry-tmp.stale1", b"stale");
    fs::remove_file(dst.join("d1/link")).unwrap();
    write(&dst, "d1/link", b"a file where SRC has a symlink");
    (t, src, dst)
}

#[test]
fn dry_run_changes_nothing_and_prints_plan() {
    for cmd in ["copy", "sync"] {
        for flag in ["--dry-run", "-n"] {
            let (_t, src, dst) = divergent();
            let (s0, d0) = (snapshot(&src), snapshot(&dst));
            let r = run_on(cmd, &src, &dst, &[flag]);
            r.ok();
            assert_untouched(&s0, &snapshot(&src));
            assert_untouched(&d0, &snapshot(&dst));
            let all = r.all();
            for name in ["new.txt", "newdir", "a.txt"] {
                assert!(
                    all.contains(name),
                    "{cmd} {flag}: plan does not mention {name}\n{r}"
                );
            }
            if cmd == "sync" {
                assert!(
                    all.contains("extra.txt"),
                    "sync {flag}: plan does not mention deletion\n{r}"
                );
            }
        }
    }
}

#[test]
fn dry_run_missing_dst_is_not_created() {
    let (_t, src, dst) = src_dst();
    for cmd in ["copy", "sync"] {
        let r = run_on(cmd, &src, &dst, &["--dry-run"]);
        r.ok();
        assert!(
            fs::symlink_metadata(&dst).is_err(),
            "--dry-run created DST\n{r}"
        );
        assert!(
            r.all().contains("a.txt"),
            "plan does not mention a.txt\n{r}"
        );
    }
}

#[test]
fn dry_run_json_lists_actions() {
    let (_t, src, dst) = divergent();
    let (s0, d0) = (snapshot(&src), snapshot(&dst));
    let r = run_on("sync", &src, &dst, &["--dry-run", "--json"]);
    r.ok();
    assert_untouched(&s0, &snapshot(&src));
    assert_untouched(&d0, &snapshot(&dst));
    summary(&r);
    let acts = actions(&r);
    assert!(has_action(&acts, "copy", "new.txt"), "{acts:?}");
    assert!(has_action(&acts, "mkdir", "newdir"), "{acts:?}");
    assert!(has_action(&acts, "update", "a.txt"), "{acts:?}");
    assert!(has_action(&acts, "delete", "extra.txt"), "{acts:?}");
}

// ------------------------------------------------------------------------------------------
// Excludes
// ------------------------------------------------------------------------------------------

fn exclude_tree(root: &Path) {
    write(root, "keep.txt", b"k");
    write(root, "app.log", b"log");
    write(root, "sub/deep.log", b"log");
    write(root, "sub/keep.rs", b"rs");
    write(root, "build/out.o", b"obj");
    write(root, "sub/build/out.o", b"obj");
    write(
        root,
        "other/build",
        b"a FILE named build: not matched by `build/`",
    );
    write(root, "top-only", b"excluded at the top");
    write(root, "sub/top-only", b"kept below the top");
    write(root, "important.log", b"negated");
    stamp_tree(root, 1_400_000_000);
}

#[track_caller]
fn check_excluded(dst: &Path, src: &Path, negation: bool) {
    for gone in ["app.log", "sub/deep.log", "build", "sub/build", "top-only"] {
        assert!(
            fs::symlink_metadata(dst.join(gone)).is_err(),
            "{gone} should be excluded"
        );
    }
    for kept in ["keep.txt", "sub/keep.rs", "other/build", "sub/top-only"] {
        assert_trees_equal(&src.join(kept), &dst.join(kept));
    }
    assert_eq!(
        fs::symlink_metadata(dst.join("important.log")).is_ok(),
        negation
    );
}

#[test]
fn exclude_gitignore_globs() {
    for cmd in ["copy", "sync"] {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        exclude_tree(&src);
        run_on(
            cmd,
            &src,
            &dst,
            &[
                "--exclude",
                "*.log",
                "--exclude",
                "build/",
                "--exclude",
                "/top-only",
            ],
        )
        .ok();
        check_excluded(&dst, &src, false);
    }
}

#[test]
fn exclude_from_file() {
    for cmd in ["copy", "sync"] {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        exclude_tree(&src);
        let ign = write(
            t.path(),
            "ignore",
            b"# comment\n*.log\n\nbuild/\n/top-only\n!important.log\n",
        );
        run_on(cmd, &src, &dst, &["--exclude-from", ign.to_str().unwrap()]).ok();
        check_excluded(&dst, &src, true);
    }
}

#[test]
fn sync_does_not_delete_excluded_dst_entries() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    exclude_tree(&src);
    write(&dst, "local.log", b"dst only, excluded");
    write(&dst, "sub/build/cache.bin", b"dst only, excluded dir");
    write(&dst, "top-only", b"dst version of an excluded entry");
    write(&dst, "stray.txt", b"dst only, not excluded: deleted");
    let keep = ["local.log", "sub/build/cache.bin", "top-only"];
    let before = snapshot(&dst);
    run_on(
        "sync",
        &src,
        &dst,
        &[
            "--exclude",
            "*.log",
            "--exclude",
            "build/",
            "--exclude",
            "/top-only",
        ],
    )
    .ok();
    let after = snapshot(&dst);
    for k in keep {
        let p = PathBuf::from(k);
        assert_eq!(before.get(&p), after.get(&p), "sync touched excluded {k}");
    }
    assert!(
        !dst.join("stray.txt").exists(),
        "stray.txt should have been deleted"
    );
    assert!(!dst.join("app.log").exists());
    assert_trees_equal(&src.join("keep.txt"), &dst.join("keep.txt"));
}

#[test]
fn exclude_patterns_with_slash_are_relative_to_root() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "a/x.txt", b"excluded: matches a/x.txt at the root");
    write(&src, "b/a/x.txt", b"kept: a/x.txt is anchored");
    write(&src, "docs/readme.md", b"excluded by **/*.md");
    write(&src, "deep/er/notes.md", b"excluded by **/*.md");
    write(&src, "keep.txt", b"kept");
    stamp_tree(&src, 1_400_000_000);
    run_on(
        "sync",
        &src,
        &dst,
        &["--exclude", "a/x.txt", "--exclude", "**/*.md"],
    )
    .ok();
    assert!(!dst.join("a/x.txt").exists());
    assert!(!dst.join("docs/readme.md").exists());
    assert!(!dst.join("deep/er/notes.md").exists());
    assert_trees_equal(&src.join("b/a/x.txt"), &dst.join("b/a/x.txt"));
    assert_trees_equal(&src.join("keep.txt"), &dst.join("keep.txt"));
}

// ------------------------------------------------------------------------------------------
// --json and the summary
// ------------------------------------------------------------------------------------------

fn count_tree(root: &Path) {
    write(root, "a.txt", &[b'a'; 10]);
    write(root, "b.bin", &gen_bytes(4096, 3));
    write(root, "empty", b"");
    write(root, "d1/c.txt", &[b'c'; 100]);
    write(root, "d1/d2/e", &gen_bytes(65_539, 4));
    mkdirs(root, "d3");
    stamp_tree(root, 1_300_000_000);
}
const COUNT_FILES: u64 = 5;
const COUNT_BYTES: u64 = 10 + 4096 + 100 + 65_539;
const COUNT_DIRS: u64 = 3;

#[test]
fn json_summary_counts() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    count_tree(&src);
    fs::create_dir(&dst).unwrap();

    let r = run_on("sync", &src, &dst, &["--json"]);
    r.ok();
    let s1 = summary(&r);
    assert_eq!(s1.files_copied, COUNT_FILES, "{r}");
    assert_eq!(s1.bytes_copied, COUNT_BYTES, "{r}");
    assert_eq!(s1.dirs_created, COUNT_DIRS, "{r}");
    assert_eq!(s1.files_deleted, 0, "{r}");
    assert_eq!(s1.unchanged, 0, "{r}");
    assert_eq!(s1.errors, 0, "{r}");
    assert!(s1.entries_scanned >= COUNT_FILES + COUNT_DIRS, "{r}");
    let acts = actions(&r);
    for f in ["a.txt", "b.bin", "empty", "d1/c.txt", "d1/d2/e"] {
        assert!(has_action(&acts, "copy", f), "no copy action for {f}\n{r}");
    }
    for d in ["d1", "d1/d2", "d3"] {
        assert!(
            has_action(&acts, "mkdir", d),
            "no mkdir action for {d}\n{r}"
        );
    }
    assert_trees_equal(&src, &dst);

    // second run: nothing copied, files counted unchanged
    let r = run_on("sync", &src, &dst, &["--json"]);
    r.ok();
    let s2 = summary(&r);
    assert_eq!(
        (
            s2.files_copied,
            s2.bytes_copied,
            s2.dirs_created,
            s2.files_deleted,
            s2.errors
        ),
        (0, 0, 0, 0, 0),
        "{r}"
    );
    // "unchanged" counts at least the files; whether directories count is not pinned down.
    assert!(
        (COUNT_FILES..=COUNT_FILES + COUNT_DIRS + 1).contains(&s2.unchanged),
        "unchanged = {}\n{r}",
        s2.unchanged
    );
    assert!(s2.entries_scanned >= COUNT_FILES + COUNT_DIRS, "{r}");
    let acts = actions(&r);
    assert!(
        acts.iter()
            .all(|(t, _)| !["copy", "update", "delete", "mkdir"].contains(&t.as_str())),
        "second run did something: {acts:?}"
    );

    // an update and two deletions
    write(&src, "a.txt", &[b'A'; 33]);
    set_mtime(&src.join("a.txt"), (1_310_000_000, 42));
    set_mtime(&src, (1_299_000_000, 7));
    write(&dst, "extra1", b"x");
    write(&dst, "d1/extra2", b"y");
    let r = run_on("sync", &src, &dst, &["--json"]);
    r.ok();
    let s3 = summary(&r);
    assert_eq!(s3.files_copied, 1, "{r}");
    assert_eq!(s3.bytes_copied, 33, "{r}");
    assert_eq!(s3.files_deleted, 2, "{r}");
    assert_eq!(s3.errors, 0, "{r}");
    let acts = actions(&r);
    assert!(has_action(&acts, "update", "a.txt"), "{acts:?}");
    assert!(has_action(&acts, "delete", "extra1"), "{acts:?}");
    assert!(has_action(&acts, "delete", "d1/extra2"), "{acts:?}");
    assert_trees_equal(&src, &dst);
}

#[test]
fn json_copy_with_dst_extras_deletes_nothing() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    count_tree(&src);
    write(&dst, "extra", b"x");
    let r = run_on("copy", &src, &dst, &["--json"]);
    r.ok();
    let s = summary(&r);
    assert_eq!(
        (s.files_copied, s.bytes_copied, s.files_deleted),
        (COUNT_FILES, COUNT_BYTES, 0),
        "{r}"
    );
    assert!(!actions(&r).iter().any(|(t, _)| t == "delete"), "{r}");
    assert!(dst.join("extra").exists());
}

const JSON_NAMES: [&str; 7] = [
    "new\nline",
    "quo\"te",
    "back\\slash",
    "tab\there",
    "ünïcødé 日本",
    "ctl\u{1}x",
    "sp ace",
];

#[test]
fn json_escapes_odd_names() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    for n in JSON_NAMES {
        write(&src, n, n.as_bytes());
    }
    write(&src, "dir \"q\"/inner\\x", b"inner");
    stamp_tree(&src, 1_400_000_000);
    let r = run_on("copy", &src, &dst, &["--json"]);
    r.ok();
    assert_eq!(summary(&r).files_copied, JSON_NAMES.len() as u64 + 1, "{r}");
    let acts = actions(&r);
    for n in JSON_NAMES {
        assert!(
            has_action(&acts, "copy", n),
            "no copy action with path {n:?}: {acts:?}"
        );
    }
    assert!(has_action(&acts, "copy", "dir \"q\"/inner\\x"), "{acts:?}");
    assert_trees_equal(&src, &dst);

    let r = ferry([
        OsString::from("ls"),
        OsString::from("--json"),
        src.clone().into(),
    ]);
    r.ok();
    let paths: Vec<String> = json_lines(&r)
        .iter()
        .filter_map(|j| {
            j.str_field("path")
                .map(|p| p.trim_end_matches('/').to_owned())
        })
        .collect();
    for n in JSON_NAMES {
        assert!(
            paths.iter().any(|p| p == n),
            "ls --json lacks {n:?}: {paths:?}"
        );
    }
}

#[test]
fn human_summary_on_stderr_without_json() {
    let (_t, src, dst) = src_dst();
    let r = run_on("sync", &src, &dst, &[]);
    r.ok();
    let err = r.err();
    assert!(
        err.lines().any(|l| !l.trim().is_empty()),
        "no human summary on stderr\n{r}"
    );
    assert!(
        parse_json(err.lines().last().unwrap_or("")).is_err() || err.is_empty(),
        "{r}"
    );
}

#[test]
fn verbose_prints_actions() {
    let (_t, src, dst) = src_dst();
    let r = run_on("sync", &src, &dst, &["-v"]);
    r.ok();
    for name in ["a.txt", "deep.bin", "d1"] {
        assert!(r.all().contains(name), "-v does not mention {name}\n{r}");
    }
    assert_trees_equal(&src, &dst);
}

#[test]
fn jobs_progress_fsync_flags_work() {
    let flagsets: [&[&str]; 6] = [
        &["-j", "1"],
        &["--jobs", "3"],
        &["--jobs", "16"],
        &["--no-progress"],
        &["--progress"],
        &["--fsync"],
    ];
    for flags in flagsets {
        let (_t, src, dst) = src_dst();
        run_on("sync", &src, &dst, flags).ok();
        assert_trees_equal(&src, &dst);
    }
}

// ------------------------------------------------------------------------------------------
// Exit code 1: per-entry failures
// ------------------------------------------------------------------------------------------

#[test]
fn copy_refuses_to_delete_dir_for_file_exit_1() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "x", b"x is a file in SRC");
    write(&src, "ok1", b"ok1");
    write(&src, "sub/ok2", b"ok2");
    write(&src, "zz_last", b"after x in order");
    stamp_tree(&src, 1_500_000_000);
    write(&dst, "x/inner", b"x is a non-empty dir in DST");
    for json in [false, true] {
        let r = run_on("copy", &src, &dst, if json { &["--json"] } else { &[] });
        r.code_is(1);
        let errs = r.error_lines();
        assert_eq!(
            errs.len(),
            1,
            "expected exactly one `ferry: PATH: cause` line\n{r}"
        );
        assert!(
            errs[0].contains("x: "),
            "error line does not name x: {:?}",
            errs[0]
        );
        if json {
            let s = summary(&r);
            assert_eq!(s.errors, 1, "{r}");
            assert!(
                actions(&r)
                    .iter()
                    .any(|(t, p)| t == "error" && path_is(p, "x")),
                "{r}"
            );
        }
        assert_eq!(
            fs::read(dst.join("x/inner")).unwrap(),
            b"x is a non-empty dir in DST"
        );
        for f in ["ok1", "sub/ok2", "zz_last"] {
            assert_trees_equal(&src.join(f), &dst.join(f));
        }
    }
}

#[test]
fn immutable_dst_file_gives_exit_1_and_rest_is_done() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "a_first", b"a");
    write(&src, "f", b"new content for f");
    write(&src, "g", b"g");
    write(&src, "sub/h", b"h");
    stamp_tree(&src, 1_500_000_000);
    let f = write(&dst, "f", b"old");
    let stuck = write(&dst, "stuck", b"sync wants to delete this");
    let Some(_g1) = Immutable::try_set(&f) else {
        eprintln!("SKIP: chattr +i does not work here");
        return;
    };
    let Some(_g2) = Immutable::try_set(&stuck) else {
        eprintln!("SKIP: chattr +i does not work here");
        return;
    };
    let r = run_on("copy", &src, &dst, &[]);
    r.code_is(1);
    let errs = r.error_lines();
    assert!(
        errs.iter().any(|l| l.contains("f: ")),
        "no error line naming f\n{r}"
    );
    assert_eq!(fs::read(&f).unwrap(), b"old");
    for x in ["a_first", "g", "sub/h"] {
        assert_trees_equal(&src.join(x), &dst.join(x));
    }

    let r = run_on("sync", &src, &dst, &["--json"]);
    r.code_is(1);
    let errs = r.error_lines();
    assert!(
        errs.iter().any(|l| l.contains("stuck: ")),
        "no error line naming stuck\n{r}"
    );
    assert!(
        errs.iter().any(|l| l.contains("f: ")),
        "no error line naming f\n{r}"
    );
    assert_eq!(summary(&r).errors, 2, "{r}");
    assert!(stuck.exists());
    for x in ["a_first", "g", "sub/h"] {
        assert_trees_equal(&src.join(x), &dst.join(x));
    }
}

// ------------------------------------------------------------------------------------------
// Type changes, temporaries
// ------------------------------------------------------------------------------------------

#[test]
fn sync_handles_type_changes() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let outside = t.path().join("outside");
    write(&outside, "o.txt", b"outside file");
    let outside_file = write(t.path(), "outside_file", b"outside single file");
    // SRC side
    write(&src, "f2d/inner", b"now a dir");
    write(&src, "d2f", b"now a file");
    ln(&src, "f2l", "target-of-f2l");
    write(&src, "l2f", b"now a file, was a link to outside_file");
    ln(&src, "d2l", "../somewhere");
    write(&src, "l2d/inner.txt", b"now a dir, was a link to outside");
    ln(&src, "l2l", "new-target");
    write(&src, "same", b"same");
    stamp_tree(&src, 1_500_000_000);
    // DST side
    write(&dst, "f2d", b"was a file");
    write(&dst, "d2f/deep/inner", b"was a dir");
    write(&dst, "f2l", b"was a file");
    ln(&dst, "l2f", &outside_file);
    write(&dst, "d2l/x", b"was a dir");
    ln(&dst, "l2d", &outside);
    ln(&dst, "l2l", "old-target");
    let outside_before = (snapshot(&outside), snapshot(&outside_file));
    run_on("sync", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
    assert_same_content(&outside_before.0, &snapshot(&outside));
    assert_same_content(&outside_before.1, &snapshot(&outside_file));
    // and back again
    let t2 = tmpdir();
    let src2 = t2.path().join("src2");
    write(&src2, "f2d", b"file again");
    write(&src2, "d2f/deep/inner", b"dir again");
    write(&src2, "f2l", b"file again");
    mkdirs(&src2, "l2l");
    stamp_tree(&src2, 1_510_000_000);
    run_on("sync", &src2, &dst, &[]).ok();
    assert_trees_equal(&src2, &dst);
}

// ------------------------------------------------------------------------------------------
// What is preserved
// ------------------------------------------------------------------------------------------

#[test]
fn symlinks_copied_verbatim_never_followed() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let outside = t.path().join("outside");
    write(&outside, "secret", b"outside content");
    write(&src, "file", b"f");
    ln(&src, "rel", "file");
    ln(&src, "dangling", "nope/missing");
    ln(&src, "abs_dir", &outside);
    ln(&src, "abs_dangling", "/nonexistent-ferry-test/x");
    ln(&src, "loop", ".");
    ln(&src, "up", "../..");
    ln(&src, "sub/chain", "../rel");
    ln(&src, "long", "x".repeat(300));
    ln(&src, "nonutf8", std::ffi::OsStr::from_bytes(b"tar\xffget"));
    stamp_tree(&src, 1_450_000_000);
    for cmd in ["copy", "sync"] {
        let d = dst.with_extension(cmd);
        run_on(cmd, &src, &d, &[]).ok();
        assert_trees_equal(&src, &d);
        assert!(fs::symlink_metadata(d.join("abs_dir"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(fs::symlink_metadata(d.join("loop"))
            .unwrap()
            .file_type()
            .is_symlink());
    }
}

#[test]
fn odd_and_non_utf8_names_survive() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    let names: [&[u8]; 12] = [
        b"\xff\xfe.bin",
        b"caf\xe9",
        b"with space",
        b"new\nline",
        b"-rf",
        b"--help",
        "ünïcødé 日本".as_bytes(),
        b"back\\slash",
        b"star*?[x]",
        b"tab\there",
        b"colon:semi;",
        b"'quote\"",
    ];
    for (i, n) in names.iter().enumerate() {
        let name = std::ffi::OsStr::from_bytes(n);
        fs::write(src.join(name), gen_bytes(i * 10, i as u64)).unwrap();
    }
    let d = src.join(std::ffi::OsStr::from_bytes(b"dir\x80"));
    fs::create_dir(&d).unwrap();
    fs::write(d.join(std::ffi::OsStr::from_bytes(b"\xc3\x28")), b"inner").unwrap();
    std::os::unix::fs::symlink("target", src.join(std::ffi::OsStr::from_bytes(b"link\xfe")))
        .unwrap();
    stamp_tree(&src, 1_450_000_000);
    for cmd in ["copy", "sync"] {
        let dd = dst.with_extension(cmd);
        run_on(cmd, &src, &dd, &[]).ok();
        assert_trees_equal(&src, &dd);
    }
    // and sync deletes non-UTF-8 names too
    let dd = dst.with_extension("sync");
    fs::write(dd.join(std::ffi::OsStr::from_bytes(b"gone\xff")), b"x").unwrap();
    run_on("sync", &src, &dd, &[]).ok();
    assert_trees_equal(&src, &dd);
}

#[test]
fn empty_dirs_and_dir_mtimes_preserved() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    mkdirs(&src, "a/b/c/d");
    mkdirs(&src, "e");
    write(&src, "f/g/file", &gen_bytes(5000, 5));
    mkdirs(&src, "f/g/h");
    stamp_tree(&src, 1_234_567_890);
    for cmd in ["copy", "sync"] {
        let d = dst.with_extension(cmd);
        run_on(cmd, &src, &d, &[]).ok();
        assert_trees_equal(&src, &d);
    }
    // a dir mtime change alone is propagated
    let d = dst.with_extension("sync");
    set_mtime(&src.join("a/b"), (1_111_111_111, 111_111_111));
    set_mtime(&src, (1_111_111_112, 2));
    run_on("sync", &src, &d, &[]).ok();
    assert_trees_equal(&src, &d);
}

#[test]
fn permission_bits_preserved() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let files: [(&str, u32); 6] = [
        ("f640", 0o640),
        ("f755", 0o755),
        ("f444", 0o444),
        ("f600", 0o600),
        ("f400", 0o400),
        ("d700/f711", 0o711),
    ];
    for (n, _) in files {
        write(&src, n, n.as_bytes());
    }
    mkdirs(&src, "d555/inner");
    write(&src, "d555/inner/x", b"x");
    mkdirs(&src, "d750");
    for (n, m) in files {
        chmod(&src.join(n), m);
    }
    chmod(&src.join("d700"), 0o700);
    chmod(&src.join("d555"), 0o555);
    chmod(&src.join("d750"), 0o750);
    chmod(&src, 0o751);
    stamp_tree(&src, 1_222_222_222);
    for cmd in ["copy", "sync"] {
        let d = dst.with_extension(cmd);
        run_on(cmd, &src, &d, &[]).ok();
        assert_trees_equal(&src, &d);
        // a chmod alone (same size and mtime) is propagated
        let p = src.join("f640");
        let mt = get_mtime(&p);
        chmod(&p, 0o604);
        set_mtime(&p, mt);
        run_on(cmd, &src, &d, &[]).ok();
        assert_trees_equal(&src, &d);
        chmod(&p, 0o640);
        set_mtime(&p, mt);
    }
}

#[test]
fn extreme_mtimes_preserved() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let times: [(&str, Mtime); 7] = [
        ("neg", (-2, 750_000_000)),
        ("neg_whole", (-86_400, 0)),
        ("zero", (0, 0)),
        ("one_ns", (0, 1)),
        ("max_ns", (1_600_000_000, 999_999_999)),
        ("y2100", (4_102_444_800, 999_999_999)),
        ("y2038", (2_147_483_648, 5)),
    ];
    for (n, _) in times {
        write(&src, n, n.as_bytes());
        write(&src, format!("d_{n}/x"), b"x");
        ln(&src, format!("l_{n}"), "x");
    }
    for (n, tm) in times {
        set_mtime(&src.join(format!("d_{n}/x")), tm);
        set_mtime(&src.join(n), tm);
        set_mtime(&src.join(format!("d_{n}")), tm);
        set_mtime(&src.join(format!("l_{n}")), tm);
        assert_eq!(
            get_mtime(&src.join(n)),
            tm,
            "test setup: could not set mtime {tm:?}"
        );
    }
    set_mtime(&src, (-1, 1));
    for cmd in ["copy", "sync"] {
        let d = dst.with_extension(cmd);
        run_on(cmd, &src, &d, &[]).ok();
        assert_trees_equal(&src, &d);
        // and a second run sees them as unchanged
        let r = run_on(cmd, &src, &d, &["--json"]);
        r.ok();
        assert_eq!(summary(&r).files_copied, 0, "{r}");
    }
}

#[test]
fn mode_000_file_copied_as_root() {
    if !is_root() {
        crate::util::skip(&"not root");
        return;
    }
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "locked", b"root can still read this");
    write(&src, "d000/inner", b"inside a mode 000 dir");
    chmod(&src.join("locked"), 0o000);
    chmod(&src.join("d000"), 0o000);
    stamp_tree(&src, 1_200_000_000);
    run_on("sync", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
}

#[test]
fn many_entries_in_one_directory() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    for i in 0..3000u64 {
        write(
            &src,
            format!("big/f{i:05}"),
            &gen_bytes((i % 97) as usize, i),
        );
    }
    stamp_tree(&src, 1_500_000_000);
    run_on("sync", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
    for i in (0..3000u64).step_by(2) {
        fs::remove_file(src.join(format!("big/f{i:05}"))).unwrap();
    }
    for i in (1..3000u64).step_by(6) {
        write(&src, format!("big/f{i:05}"), b"changed");
    }
    stamp_tree(&src, 1_510_000_000);
    let r = run_on("sync", &src, &dst, &["--json"]);
    r.ok();
    let s = summary(&r);
    assert_eq!((s.files_deleted, s.files_copied), (1500, 1500), "{r}");
    assert_trees_equal(&src, &dst);
}

#[test]
fn deep_nesting() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let mut rel = PathBuf::new();
    for i in 0..150 {
        rel.push(format!("d{i}"));
    }
    write(&src, rel.join("bottom.txt"), b"deep");
    write(&src, "top.txt", b"top");
    stamp_tree(&src, 1_500_000_000);
    for cmd in ["copy", "sync"] {
        let d = dst.with_extension(cmd);
        run_on(cmd, &src, &d, &[]).ok();
        assert_trees_equal(&src, &d);
    }
    let d = dst.with_extension("sync");
    fs::remove_dir_all(src.join("d0/d1/d2")).unwrap();
    run_on("sync", &src, &d, &[]).ok();
    assert_trees_equal(&src, &d);
}

#[test]
fn special_permission_bits_preserved() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "suid", b"s");
    write(&src, "sgid", b"g");
    mkdirs(&src, "sticky");
    mkdirs(&src, "sgiddir");
    chmod(&src.join("suid"), 0o4755);
    chmod(&src.join("sgid"), 0o2755);
    chmod(&src.join("sticky"), 0o1777);
    chmod(&src.join("sgiddir"), 0o2775);
    stamp_tree(&src, 1_222_222_222);
    run_on("sync", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
}

#[test]
fn owner_and_group_preserved_as_root() {
    if !is_root() {
        crate::util::skip(&"not root");
        return;
    }
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "f", b"f");
    write(&src, "d/g", b"g");
    ln(&src, "l", "f");
    write(&src, "suid_owned", b"s");
    lchown(src.join("f"), Some(1234), Some(5678)).unwrap();
    lchown(src.join("d"), Some(4321), Some(8765)).unwrap();
    lchown(src.join("d/g"), Some(1000), Some(0)).unwrap();
    lchown(src.join("l"), Some(1111), Some(2222)).unwrap();
    lchown(src.join("suid_owned"), Some(1500), Some(1500)).unwrap();
    chmod(&src.join("suid_owned"), 0o4750); // chown clears suid, so chmod after chown
    stamp_tree(&src, 1_333_333_333);
    for cmd in ["copy", "sync"] {
        let d = dst.with_extension(cmd);
        run_on(cmd, &src, &d, &[]).ok();
        assert_trees_equal(&src, &d);
    }
    // owner change alone is propagated
    let d = dst.with_extension("sync");
    let mt = get_mtime(&src.join("f"));
    lchown(src.join("f"), Some(999), Some(998)).unwrap();
    set_mtime(&src.join("f"), mt);
    run_on("sync", &src, &d, &[]).ok();
    assert_trees_equal(&src, &d);
    assert_eq!(fs::metadata(d.join("f")).unwrap().uid(), 999);
}

/// A socket file, left behind by a listener that is gone.
fn mksock(p: &Path) {
    drop(std::os::unix::net::UnixListener::bind(p).unwrap());
}

#[test]
fn fifos_are_made_sockets_skipped() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "f", b"f");
    mkfifo(&src.join("pipe"));
    mksock(&src.join("sock"));
    write(&src, "sub/g", b"g");
    mkfifo(&src.join("sub/pipe2"));
    for cmd in ["copy", "sync"] {
        let d = dst.with_extension(cmd);
        let r = run_on(cmd, &src, &d, &[]);
        r.ok();
        assert!(
            fs::symlink_metadata(d.join("sock")).is_err(),
            "sock copied\n{r}"
        );
        for x in ["pipe", "sub/pipe2"] {
            let m = fs::symlink_metadata(d.join(x)).unwrap_or_else(|e| panic!("{x}: {e}\n{r}"));
            assert!(m.file_type().is_fifo(), "{x} is not a fifo\n{r}");
        }

        for x in ["f", "sub/g"] {
            assert_trees_equal(&src.join(x), &d.join(x));
        }
    }
}

#[test]
fn special_files_skipped_with_a_note() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "f", b"f");
    mksock(&src.join("pipe"));
    let r = run_on("sync", &src, &dst, &[]);
    r.ok();
    assert!(
        r.err().contains("pipe"),
        "no note (stderr) about the skipped socket\n{r}"
    );
}

#[test]
fn special_files_skipped_in_json_output() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "f", b"f");
    mksock(&src.join("pipe"));
    let r = run_on("sync", &src, &dst, &["--json"]);
    r.ok();
    // every line must be one of the documented action types, last the summary
    let s = summary(&r);
    assert_eq!((s.files_copied, s.errors), (1, 0), "{r}");
    assert!(!dst.join("pipe").exists());
}

#[test]
fn unchanged_files_are_not_rewritten() {
    let (_t, src, dst) = src_dst();
    run_on("sync", &src, &dst, &[]).ok();
    let before = snapshot(&dst);
    for cmd in ["copy", "sync"] {
        run_on(cmd, &src, &dst, &[]).ok();
        let after = snapshot(&dst);
        for (k, e) in &before {
            if e.kind == Kind::File {
                assert_eq!(
                    e.ino, after[k].ino,
                    "{cmd}: unchanged file {k:?} was replaced"
                );
            }
        }
        assert_same_content(&before, &after);
    }
}

#[test]
fn checksum_detects_same_size_same_mtime_change() {
    for flag in ["--checksum", "-c"] {
        let (_t, src, dst) = src_dst();
        run_on("sync", &src, &dst, &[]).ok();
        rewrite_keep_meta(&src.join("a.txt"), b"HELLO FERRY\n");
        let mut d2 = fs::read(src.join("d1/d2/deep.bin")).unwrap();
        d2[2000] ^= 0x55;
        rewrite_keep_meta(&src.join("d1/d2/deep.bin"), &d2);
        let r = run_on("sync", &src, &dst, &["--json"]);
        r.ok();
        assert_eq!(summary(&r).files_copied, 0, "{r}");
        assert_eq!(fs::read(dst.join("a.txt")).unwrap(), b"hello ferry\n");
        let r = run_on("sync", &src, &dst, &[flag, "--json"]);
        r.ok();
        assert_eq!(summary(&r).files_copied, 2, "{r}");
        assert_trees_equal(&src, &dst);
    }
}

// ------------------------------------------------------------------------------------------
// ferry ls
// ------------------------------------------------------------------------------------------

fn ls_tree(root: &Path) {
    write(root, "a", b"12345");
    write(root, "d/b", b"");
    write(root, "d/c c", &gen_bytes(1000, 1));
    mkdirs(root, "d/e");
    write(root, "Z", b"upper sorts first");
    ln(root, "l", "a");
    write(root, "d/e2/x", b"x");
    mkfifo(&root.join("fifo"));
    stamp_tree(root, 1_700_000_000);
    chmod(&root.join("a"), 0o640);
}

fn is_root_line(p: &str) -> bool {
    matches!(p, "" | "." | "./" | "/")
}

/// Children of each directory must appear in byte order.
#[track_caller]
fn check_sibling_order(paths: &[String]) {
    let mut by_parent: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for p in paths {
        let (parent, name) = match p.rfind('/') {
            Some(i) => (p[..i].to_owned(), p[i + 1..].to_owned()),
            None => (String::new(), p.clone()),
        };
        by_parent.entry(parent).or_default().push(name);
    }
    for (parent, names) in by_parent {
        let mut sorted = names.clone();
        sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        assert_eq!(names, sorted, "entries of {parent:?} not sorted by name");
    }
}

#[test]
fn ls_text_format() {
    let t = tmpdir();
    let root = t.path().join("tree");
    ls_tree(&root);
    let r = ferry([OsString::from("ls"), root.clone().into()]);
    r.ok();
    let mut seen = std::collections::BTreeMap::new();
    let mut order = Vec::new();
    for line in r.out().lines() {
        let mut it = line.splitn(3, ' ');
        let size: u64 = it
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("bad SIZE in {line:?}"));
        let mt: i128 = it
            .next()
            .unwrap_or("")
            .parse()
            .unwrap_or_else(|_| panic!("bad MTIME_NS in {line:?}"));
        let rest = it.next().unwrap_or_else(|| panic!("no PATH in {line:?}"));
        if is_root_line(rest) {
            continue;
        }
        let (path, target) = match rest.split_once(" -> ") {
            Some((p, t)) => (p.to_owned(), Some(t.to_owned())),
            None => (rest.to_owned(), None),
        };
        order.push(path.trim_end_matches('/').to_owned());
        assert!(
            seen.insert(path.clone(), (size, mt, target)).is_none(),
            "duplicate {path}"
        );
    }
    let ns = |rel: &str| {
        let md = fs::symlink_metadata(root.join(rel)).unwrap();
        i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec())
    };
    let expect_files = [
        ("a", 5u64),
        ("d/b", 0),
        ("d/c c", 1000),
        ("Z", 17),
        ("d/e2/x", 1),
    ];
    for (p, size) in expect_files {
        let (sz, mt, tg) = seen.get(p).unwrap_or_else(|| panic!("{p} not listed\n{r}"));
        assert_eq!(
            (*sz, *mt, tg.as_deref()),
            (size, ns(p), None),
            "line for {p}\n{r}"
        );
    }
    for d in ["d/", "d/e/", "d/e2/"] {
        let (_, mt, _) = seen
            .get(d)
            .unwrap_or_else(|| panic!("{d} not listed with trailing /\n{r}"));
        assert_eq!(*mt, ns(d.trim_end_matches('/')), "mtime of {d}\n{r}");
    }
    let (_, mt, tg) = seen
        .get("l")
        .unwrap_or_else(|| panic!("symlink l not listed as `l -> a`\n{r}"));
    assert_eq!((tg.as_deref(), *mt), (Some("a"), ns("l")), "{r}");
    assert!(seen.contains_key("fifo"), "fifo not listed\n{r}");
    assert_eq!(seen.len(), 10, "{r}");
    check_sibling_order(&order);
    assert!(snapshot(&root).len() == 11);
}

#[test]
fn ls_json_format() {
    let t = tmpdir();
    let root = t.path().join("tree");
    ls_tree(&root);
    let r = ferry([
        OsString::from("ls"),
        OsString::from("--json"),
        root.clone().into(),
    ]);
    r.ok();
    let mut seen = std::collections::BTreeMap::new();
    let mut order = Vec::new();
    for j in json_lines(&r) {
        let path = j
            .str_field("path")
            .unwrap_or_else(|| panic!("no path in {j:?}"))
            .to_owned();
        if is_root_line(&path) {
            continue;
        }
        order.push(path.trim_end_matches('/').to_owned());
        seen.insert(path.trim_end_matches('/').to_owned(), j);
    }
    assert_eq!(seen.len(), 10, "{r}");
    for (p, j) in &seen {
        let md = fs::symlink_metadata(root.join(p)).unwrap();
        let kind = match kind_of(&md) {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Other if md.file_type().is_fifo() => "fifo",
            Kind::Other => "other",
        };
        assert_eq!(j.str_field("kind"), Some(kind), "kind of {p}: {j:?}");
        let mt = i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec());
        assert_eq!(
            j.get("mtime_ns").and_then(Json::as_i128),
            Some(mt),
            "mtime_ns of {p}: {j:?}"
        );
        let mode = j
            .get("mode")
            .and_then(Json::as_u64)
            .unwrap_or_else(|| panic!("mode of {p}: {j:?}"));
        if kind != "symlink" {
            assert_eq!(
                mode as u32 & 0o7777,
                md.mode() & 0o7777,
                "mode of {p}: {j:?}"
            );
        }
        let size = j
            .get("size")
            .and_then(Json::as_u64)
            .unwrap_or_else(|| panic!("size of {p}: {j:?}"));
        if kind == "file" {
            assert_eq!(size, md.len(), "size of {p}");
        }
        if kind == "symlink" {
            assert_eq!(j.str_field("target"), Some("a"), "target of {p}: {j:?}");
        } else {
            assert!(
                j.get("target").is_none(),
                "target on non-symlink {p}: {j:?}"
            );
        }
    }
    check_sibling_order(&order);
}

#[test]
fn ls_missing_path_fails() {
    let t = tmpdir();
    let r = ferry([OsString::from("ls"), t.path().join("nope").into()]);
    assert_ne!(r.code, Some(0), "{r}");
    assert!(!r.err().trim().is_empty(), "{r}");
}

// ------------------------------------------------------------------------------------------
// Issue 11: one-way safety
// ------------------------------------------------------------------------------------------

/// A field of the `--json` summary (the last stdout line).
#[track_caller]
fn summary_field(r: &Run, key: &str) -> u64 {
    summary(r);
    json_lines(r)
        .last()
        .and_then(|l| l.get(key))
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("summary lacks {key}\n{r}"))
}

/// `mount --bind from to`, unmounted when dropped; `None` (with a note) where mounting is
/// not possible here.
struct BindMount(PathBuf);

impl BindMount {
    fn new(from: &Path, to: &Path) -> Option<BindMount> {
        fs::create_dir_all(to).unwrap();
        let ok = std::process::Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(to)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "note: `mount --bind` is not possible here (not root?): bind-mount case skipped"
            );
            return None;
        }
        Some(BindMount(to.to_path_buf()))
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn src_and_dst_overlapping_through_a_bind_mount_exit_2() {
    let t = tmpdir();
    let v = t.path().join("v");
    sample(&v);
    write(&v, "sub/inner", b"inner");
    let vb = t.path().join("vb");
    let Some(_m) = BindMount::new(&v, &vb) else {
        return;
    };
    for cmd in ["copy", "sync"] {
        // SRC inside DST: `sync vb/sub v` used to wipe v, SRC included.
        usage_error(&[s(cmd), o(&vb.join("sub")), o(&v)], &[&v], None);
        // DST inside SRC (existing, and to be created).
        usage_error(&[s(cmd), o(&v), o(&vb.join("d1"))], &[&v], None);
        usage_error(
            &[s(cmd), o(&v), o(&vb.join("new"))],
            &[&v],
            Some(&v.join("new")),
        );
        // The same directory.
        usage_error(&[s(cmd), o(&vb), o(&v)], &[&v], None);
        usage_error(&[s(cmd), o(&v), o(&vb)], &[&v], None);
    }
    let r = ferry([s("sync"), o(&vb.join("sub")), o(&v)]);
    assert!(
        r.err().contains("same directory") && r.err().lines().count() == 1,
        "the refusal does not say why in one line\n{r}"
    );
}

#[test]
fn bisync_replicas_overlapping_through_a_bind_mount_exit_2() {
    let t = tmpdir();
    let v = t.path().join("v");
    sample(&v);
    write(&v, "sub/inner", b"inner");
    let vb = t.path().join("vb");
    let Some(_m) = BindMount::new(&v, &vb) else {
        return;
    };
    let j = t.path().join("j.sqlite");
    for (a, b) in [
        (vb.join("sub"), v.clone()),
        (v.clone(), vb.join("sub")),
        (vb.clone(), v.clone()),
    ] {
        usage_error(
            &[
                s("bisync"),
                s("--resync"),
                s("--journal"),
                o(&j),
                o(&a),
                o(&b),
            ],
            &[&v],
            None,
        );
    }
    let r = ferry([
        s("bisync"),
        s("--journal"),
        o(&j),
        o(&vb.join("sub")),
        o(&v),
    ]);
    assert!(
        r.err().contains("same directory") && r.err().lines().count() == 1,
        "the refusal does not say why in one line\n{r}"
    );
}

#[test]
fn src_and_dst_overlapping_through_a_symlinked_ancestor_exit_2() {
    let t = tmpdir();
    let v = t.path().join("v");
    sample(&v);
    write(&v, "sub/inner", b"inner");
    let vl = ln(t.path(), "vl", "v");
    for cmd in ["copy", "sync"] {
        usage_error(&[s(cmd), o(&vl.join("sub")), o(&v)], &[&v], None);
        usage_error(&[s(cmd), o(&v), o(&vl.join("sub"))], &[&v], None);
        usage_error(
            &[s(cmd), o(&v), o(&vl.join("new"))],
            &[&v],
            Some(&v.join("new")),
        );
        usage_error(&[s(cmd), o(&vl), o(&v)], &[&v], None);
    }
}

#[test]
fn sync_refuses_an_empty_src_against_a_non_empty_dst() {
    let (_t, full, dst) = src_dst();
    run_on("sync", &full, &dst, &[]).ok();
    let empty = full.parent().unwrap().join("empty");
    fs::create_dir(&empty).unwrap();
    for extra in [&[][..], &["-n"], &["--json"]] {
        let mut args = vec![s("sync")];
        args.extend(extra.iter().map(|x| s(x)));
        args.extend([o(&empty), o(&dst)]);
        usage_error(&args, &[&dst], None);
    }
    let r = run_on("sync", &empty, &dst, &[]);
    assert!(
        r.err().contains("empty") && r.err().contains("--force"),
        "the refusal does not say why and how to go on\n{r}"
    );
    // copy deletes nothing: nothing to refuse.
    run_on("copy", &empty, &dst, &[]).ok();
    assert_eq!(walk(&full), walk(&dst));
    // An empty DST (or one holding only excluded entries) is no reason to refuse.
    let dst2 = full.parent().unwrap().join("dst2");
    write(&dst2, "keep.log", b"x");
    run_on("sync", &empty, &dst2, &["--exclude", "*.log"]).ok();
    assert!(dst2.join("keep.log").exists());
    // --force goes ahead.
    run_on("sync", &empty, &dst, &["--force"]).ok();
    assert_trees_equal(&empty, &dst);
}

/// DST = sample + 9 entries SRC lacks (5 files, a directory holding 3 files).
fn with_extras() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (t, src, dst) = src_dst();
    run_on("sync", &src, &dst, &[]).ok();
    for i in 0..5 {
        write(&dst, format!("x{i}"), b"extra");
    }
    for i in 0..3 {
        write(&dst, format!("xd/f{i}"), b"extra");
    }
    (t, src, dst)
}

#[test]
fn max_delete_refuses_before_changing_anything() {
    let (_t, src, dst) = with_extras();
    // Something to copy as well: a refused run copies nothing either.
    write(&src, "new.txt", b"new");
    for limit in ["8", "0", "10%"] {
        let before = snapshot(&dst);
        let r = run_on("sync", &src, &dst, &["--max-delete", limit]);
        r.code_is(2);
        assert_untouched(&before, &snapshot(&dst));
        assert!(!dst.join("new.txt").exists(), "refused run copied\n{r}");
        let err = r.err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{r}");
        assert!(
            lines[0].contains("refusing to delete 9 ") && lines[0].contains(limit),
            "the line does not say how many and the limit\n{r}"
        );
    }
    // A dry run says the same.
    run_on("sync", &src, &dst, &["-n", "--max-delete", "8"]).code_is(2);
    assert!(dst.join("x0").exists());
    // copy accepts the flag and deletes nothing.
    run_on("copy", &src, &dst, &["--max-delete", "0"]).ok();
    assert!(dst.join("x0").exists() && dst.join("new.txt").exists());
    // Within the limit: 9 of the 9 + 11 (+1 new) entries DST has.
    let r = run_on("sync", &src, &dst, &["--max-delete", "9", "--json"]);
    r.ok();
    assert_eq!(summary(&r).files_deleted, 9, "{r}");
    assert_trees_equal(&src, &dst);
}

#[test]
fn max_delete_percentage_counts_entries_in_dst() {
    let (_t, src, dst) = with_extras();
    // DST: 10 sample entries + 9 extras = 19; 9 of 19 is 47.4%.
    assert_eq!(walk(&dst).len(), 19);
    let r = run_on("sync", &src, &dst, &["--max-delete", "47%"]);
    r.code_is(2);
    assert!(r.err().contains("9 of 19"), "{r}");
    assert!(dst.join("xd/f0").exists());
    let r = run_on("sync", &src, &dst, &["--max-delete", "48%", "--json"]);
    r.ok();
    assert_eq!(summary(&r).files_deleted, 9, "{r}");
    assert_trees_equal(&src, &dst);
}

#[test]
fn max_delete_bad_values_exit_2() {
    let (_t, src, dst) = src_dst();
    for bad in ["x", "-1", "101%", "5%%", ""] {
        usage_error(
            &[s("sync"), s("--max-delete"), s(bad), o(&src), o(&dst)],
            &[&src],
            Some(&dst),
        );
    }
}

#[test]
fn dry_run_counts_every_entry_of_a_tree_it_would_delete() {
    let (_t, src, dst) = with_extras();
    let r = run_on("sync", &src, &dst, &["-n", "--json"]);
    r.ok();
    let dry = summary(&r).files_deleted;
    let r = run_on("sync", &src, &dst, &["--json"]);
    r.ok();
    assert_eq!(
        dry,
        summary(&r).files_deleted,
        "dry run and run disagree\n{r}"
    );
    assert_eq!(dry, 9);
}

#[test]
fn sync_with_exclude_removes_dst_only_directories() {
    let (_t, src, dst) = with_extras();
    write(&dst, "xe/keep.log", b"excluded");
    write(&dst, "xe/go", b"not excluded");
    let r = run_on("sync", &src, &dst, &["--exclude", "*.log", "--json"]);
    r.ok();
    assert!(
        !dst.join("xd").exists(),
        "a DST-only directory was left\n{r}"
    );
    assert!(dst.join("xe/keep.log").exists() && !dst.join("xe/go").exists());
    // xd/f0..2 + xd, x0..4, xe/go
    assert_eq!(summary(&r).files_deleted, 10, "{r}");
}

/// A writer appending to `path` until told to stop.
struct Appender {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Appender {
    fn start(path: &Path) -> Appender {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut f = fs::OpenOptions::new().append(true).open(path).unwrap();
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let chunk = vec![b'+'; 4096];
            while !s.load(Ordering::Relaxed) {
                f.write_all(&chunk).unwrap();
                // The writer's pace (it appends all along), not a wait.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        Appender {
            stop,
            handle: Some(handle),
        }
    }

    fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap();
    }
}

/// A file appended to all through the run, on every copy path: big (copy_file_range in
/// chunks, reflink where possible), medium (one copy_file_range call), small, --bwlimit.
/// Whatever the timing, the run either reports the file or copies one state SRC had, and
/// the next run fixes it. (That a change during the copy is always seen is tested
/// deterministically in ferry-engine's tests/changing.rs.)
#[test]
fn a_file_growing_while_copied_is_reported_or_copied_whole() {
    for (size, extra) in [
        (96usize << 20, &[][..]),
        (1 << 20, &[][..]),
        (3000, &[][..]),
        (4 << 20, &["--bwlimit", "64M"][..]),
    ] {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        write(&src, "log", &gen_bytes(size, 5));
        let a = Appender::start(&src.join("log"));
        let mut args = vec![s("copy")];
        args.extend(extra.iter().map(|x| s(x)));
        args.extend([o(&src), o(&dst)]);
        let r = ferry(&args);
        a.stop();
        // Either an error line naming the file (exit 1) or a copy of one
        // consistent state: never exit 0 with a copy that is neither.
        let (s, d) = (src.join("log"), dst.join("log"));
        match r.code {
            Some(1) => {
                assert!(
                    r.error_lines()
                        .iter()
                        .any(|l| l.contains("log") && l.contains("changed while being copied")),
                    "{r}"
                );
            }
            Some(0) => {
                let got = fs::read(&d).unwrap();
                let want = fs::read(&s).unwrap();
                assert!(
                    want.starts_with(&got),
                    "DST is not a state SRC had ({size})\n{r}"
                );
                // What DST claims (size and mtime) is what it holds: the
                // next run sees the difference.
                let (sm, dm) = (fs::metadata(&s).unwrap(), fs::metadata(&d).unwrap());
                assert!(
                    got.len() == want.len()
                        || (sm.len(), sm.mtime_nsec()) != (dm.len(), dm.mtime_nsec()),
                    "DST holds a prefix but claims SRC's size and mtime ({size})\n{r}"
                );
                assert_eq!(dm.len(), got.len() as u64);
            }
            _ => panic!("unexpected exit\n{r}"),
        }
        // Quiet now: the next run fixes it.
        run_on("copy", &src, &dst, &[]).ok();
        assert_trees_equal(&src, &dst);
    }
}

#[test]
fn sync_removes_a_dst_entry_where_src_has_a_socket() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "f", b"f");
    mksock(&src.join("was_file"));
    mksock(&src.join("was_dir"));
    mksock(&src.join("was_link"));
    mksock(&src.join("both"));
    let setup = |d: &Path| {
        write(d, "was_file", b"stale");
        write(d, "was_dir/inner", b"stale");
        ln(d, "was_link", "f");
        mksock(&d.join("both"));
    };
    // copy never deletes: it reports each (exit 1) and leaves them.
    let dc = t.path().join("dc");
    setup(&dc);
    let r = run_on("copy", &src, &dc, &[]);
    r.code_is(1);
    for x in ["was_file", "was_dir", "was_link"] {
        assert!(
            r.error_lines().iter().any(|l| l.contains(x)),
            "no error line for {x}\n{r}"
        );
        assert!(fs::symlink_metadata(dc.join(x)).is_ok(), "copy deleted {x}");
    }
    assert!(
        !r.error_lines()
            .iter()
            .any(|l| l.contains("both") && !l.contains("skipped")),
        "{r}"
    );
    // sync: DST must not keep a stale entry of another kind.
    setup(&dst);
    let r = run_on("sync", &src, &dst, &["--json"]);
    r.ok();
    for x in ["was_file", "was_dir", "was_link"] {
        assert!(
            fs::symlink_metadata(dst.join(x)).is_err(),
            "sync left a stale {x}\n{r}"
        );
        assert!(has_action(&actions(&r), "skip", x), "{r}");
    }
    assert!(fs::symlink_metadata(dst.join("both")).is_ok());
    assert_eq!(summary(&r).files_deleted, 4, "{r}");
    assert_eq!(fs::read(dst.join("f")).unwrap(), b"f");
}

/// Run the ferry binary as user nobody (65534); `None` (with a note) when that is not
/// possible here.
fn ferry_as_nobody(args: &[&std::ffi::OsStr], bin_copy: &Path) -> Option<Run> {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin_copy)
        .args(args)
        .output();
    match out {
        Ok(o) if !String::from_utf8_lossy(&o.stderr).contains("setpriv:") => Some(Run {
            args: args.iter().map(|a| a.to_os_string()).collect(),
            code: o.status.code(),
            stdout: o.stdout,
            stderr: o.stderr,
        }),
        _ => {
            eprintln!("note: cannot run as nobody (setpriv): read-only directory test skipped");
            None
        }
    }
}

#[test]
fn read_only_source_directories_update_as_a_non_root_user() {
    if !is_root() {
        eprintln!("note: needs root to switch to user nobody: skipped");
        return;
    }
    let t = tmpdir();
    let base = t.path().join("home");
    fs::create_dir(&base).unwrap();
    // The binary where nobody can run it.
    let bin_copy = base.join("ferry");
    fs::copy(bin(), &bin_copy).unwrap();
    let (src, dst) = (base.join("src"), base.join("dst"));
    write(&src, "ro/f", b"one");
    write(&src, "ro/g", b"gone soon");
    write(&src, "ro/sub/h", b"h");
    write(&src, "top", b"top");
    let nobody = |p: &Path| {
        for e in walk(p)
            .into_iter()
            .map(|r| p.join(r))
            .chain([p.to_path_buf()])
        {
            lchown(&e, Some(65534), Some(65534)).unwrap();
        }
    };
    chmod(&src.join("ro/sub"), 0o555);
    chmod(&src.join("ro"), 0o555);
    chmod(t.path(), 0o755);
    nobody(&base);
    let Some(r) = ferry_as_nobody(&[s("copy"), o(&src), o(&dst)], &bin_copy) else {
        return;
    };
    r.ok();
    assert_eq!(
        fs::metadata(dst.join("ro")).unwrap().mode() & 0o7777,
        0o555,
        "{r}"
    );
    // Updates inside the read-only directories: a changed file, a new one, a removed one.
    chmod(&src.join("ro"), 0o755);
    fs::write(src.join("ro/f"), b"two, longer").unwrap();
    write(&src, "ro/new", b"new");
    fs::remove_file(src.join("ro/g")).unwrap();
    fs::write(src.join("ro/sub/h"), b"hh").unwrap();
    chmod(&src.join("ro"), 0o555);
    nobody(&src);
    let r = ferry_as_nobody(&[s("sync"), o(&src), o(&dst)], &bin_copy).unwrap();
    r.ok();
    assert_trees_equal(&src, &dst);
    for d in ["ro", "ro/sub"] {
        assert_eq!(
            fs::metadata(dst.join(d)).unwrap().mode() & 0o7777,
            0o555,
            "{d}: mode not restored\n{r}"
        );
    }
    // Nothing to do: no mode flip-flop either.
    let r = ferry_as_nobody(&[s("sync"), s("--json"), o(&src), o(&dst)], &bin_copy).unwrap();
    r.ok();
    assert_eq!(summary(&r).files_copied, 0, "{r}");
}

const TEMP_A: &str = ".ferry-tmp-0000302900000001.~ferry~";
const TEMP_B: &str = ".ferry-tmp-00003029000000ff.~ferry~";
const PART_OLD: &str = ".ferry-part-0123456789abcdef.~ferry~";

#[test]
fn reserved_temporaries_in_dst_are_removed_and_counted() {
    for cmd in ["copy", "sync"] {
        let (_t, src, dst) = src_dst();
        run_on(cmd, &src, &dst, &[]).ok();
        write(&dst, TEMP_A, b"half written");
        write(&dst, format!("d1/{TEMP_B}"), &gen_bytes(10_000, 9));
        ln(&dst, format!("d3/{TEMP_A}"), "whatever");
        write(&dst, format!("d1/d2/{TEMP_A}/inner"), b"x");
        // A partial download unused for longer than a week.
        write(&dst, PART_OLD, b"part");
        set_mtime(&dst.join(PART_OLD), (1_000_000_000, 0));
        let r = run_on(cmd, &src, &dst, &["--json"]);
        r.ok();
        assert_eq!(
            find_prefixed(&dst, b".ferry-"),
            Vec::<PathBuf>::new(),
            "{cmd} left temporaries"
        );
        assert_trees_equal(&src, &dst);
        assert_eq!(summary_field(&r, "temporaries_removed"), 5, "{r}");
        assert_eq!(summary(&r).files_deleted, 0, "{r}");
        // The text summary says so too.
        write(&dst, TEMP_A, b"again");
        let r = run_on(cmd, &src, &dst, &[]);
        r.ok();
        assert!(r.err().contains("1 stale temporaries removed"), "{r}");
    }
}

#[test]
fn user_files_named_like_temporaries_are_synced_like_any_file() {
    let (_t, src, dst) = src_dst();
    write(&src, ".ferry-tmp.inrsc", b"mine");
    write(&src, "d1/.ferry-tmp.part.0123456789abcdef", b"mine too");
    write(&src, ".ferry-tmp-notours.~ferry~", b"and this");
    write(&dst, ".ferry-tmp.12345", b"a user's file in DST");
    write(&dst, "d1/.ferry-tmp.abcdef", b"another");
    run_on("copy", &src, &dst, &[]).ok();
    assert_tree_contains(&dst, &src);
    assert_eq!(
        fs::read(dst.join(".ferry-tmp.12345")).unwrap(),
        b"a user's file in DST",
        "copy deleted a user's file"
    );
    assert!(dst.join("d1/.ferry-tmp.abcdef").exists());
    run_on("sync", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
}

#[test]
fn reserved_names_in_src_are_not_copied() {
    let (_t, src, dst) = src_dst();
    write(&src, TEMP_A, b"ignore me");
    write(&src, format!("d1/{PART_OLD}"), b"ignore me too");
    run_on("sync", &src, &dst, &[]).ok();
    assert_eq!(find_prefixed(&dst, b".ferry-"), Vec::<PathBuf>::new());
    assert!(dst.join("a.txt").exists() && dst.join("d1/c.txt").exists());
}

#[test]
fn an_older_versions_partial_download_is_removed_only_when_provably_ferrys() {
    let name = ".ferry-tmp.part.00112233445566ff";
    let (_t, src, dst) = src_dst();
    run_on("copy", &src, &dst, &[]).ok();
    let own = write(&dst, name, b"partial");
    let theirs = write(&dst, format!("d1/{name}"), b"a user's");
    let rec = b"ferry-partial 1\n100\n\"etag\"\n0 7\n";
    if let Err(e) = rustix::fs::setxattr(
        &own,
        "user.ferry.partial",
        rec,
        rustix::fs::XattrFlags::empty(),
    ) {
        eprintln!("note: user extended attributes unsupported here ({e}): skipped");
        return;
    }
    // Both unused for longer than a partial download is kept.
    set_mtime(&own, (1_000_000_000, 0));
    set_mtime(&theirs, (1_000_000_000, 0));
    let r = run_on("copy", &src, &dst, &["--json"]);
    r.ok();
    assert!(!own.exists(), "the old partial download stayed\n{r}");
    assert!(theirs.exists(), "copy deleted a user's file\n{r}");
    assert_eq!(summary_field(&r, "temporaries_removed"), 1, "{r}");
}

#[test]
fn symlinks_are_counted_apart_from_files() {
    let (_t, src, dst) = src_dst();
    ln(&src, "l2", "a.txt");
    let r = run_on("copy", &src, &dst, &["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "symlinks_created"), 2, "{r}");
    // a.txt, empty, b.bin, d1/c.txt, d1/d2/deep.bin
    assert_eq!(summary(&r).files_copied, 5, "{r}");
    let d2 = dst.with_extension("2");
    let r = run_on("copy", &src, &d2, &[]);
    r.ok();
    assert!(r.err().contains(" 2 symlinks"), "{r}");
}

/// A `scheme://` no backend serves is a usage error naming the schemes ferry knows, for
/// every command and either side: never a host named after the scheme (before, `gs://b/t`
/// was rsync's host `gs` with the path `//b/t`, and ssh was started for it).
#[test]
fn an_unknown_scheme_is_a_usage_error_listing_the_schemes_ferry_knows() {
    let (t, src, _) = src_dst();
    let known = "(ferry knows s3://, ssh://, sftp://; for a local name write ./gs://b/t)";
    // No ssh may be started: a remote shell that would leave a mark.
    let mark = t.path().join("rsh-ran");
    let rsh = format!("touch {}; exit 255; :", mark.display());
    let s = src.to_str().unwrap();
    for (args, side) in [
        (vec!["sync", s, "gs://b/t"], "DST "),
        (vec!["copy", "gs://b/t", s], "SRC "),
        (vec!["bisync", s, "gs://b/t"], ""),
        (vec!["ls", "gs://b/t"], ""),
        (vec!["versions", "gs://b/t"], ""),
        (vec!["restore", "gs://b/t"], ""),
    ] {
        let mut a = args.clone();
        a.extend(["-e", &rsh]);
        let r = ferry(&a);
        r.code_is(2);
        let line = format!("ferry: {side}gs://b/t: unknown scheme gs:// {known}\n");
        assert_eq!(r.err(), line, "{args:?}");
        assert!(!mark.exists(), "{args:?}: ssh was started");
    }
    // A local name with '://' in it, written as the message says.
    let local = t.path().join("gs:");
    fs::create_dir_all(local.join("b")).unwrap();
    let r = ferry([
        OsString::from("ls"),
        t.path().join("gs://b").into_os_string(),
    ]);
    r.code_is(0);
}
