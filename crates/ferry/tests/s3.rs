//! ferry against a real S3 server: the single-node Garage that
//! `scripts/test` starts (see scripts/garage), found through
//! `FERRY_TEST_S3_*` variables. Without them these tests fail, unless
//! `FERRY_SKIP_S3=1` says to skip them on purpose.

mod util;

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use util::*;

struct S3 {
    endpoint: String,
    bucket: String,
}

fn s3() -> Option<S3> {
    if std::env::var_os("FERRY_SKIP_S3").is_some() {
        return None;
    }
    let get = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run the tests with scripts/test (it starts Garage), or set FERRY_SKIP_S3=1"))
    };
    let s = S3 {
        endpoint: get("FERRY_TEST_S3_ENDPOINT"),
        bucket: get("FERRY_TEST_S3_BUCKET"),
    };
    // The ferry processes inherit these (same values from every test thread).
    std::env::set_var("AWS_ACCESS_KEY_ID", get("FERRY_TEST_S3_KEY"));
    std::env::set_var("AWS_SECRET_ACCESS_KEY", get("FERRY_TEST_S3_SECRET"));
    std::env::set_var("AWS_REGION", get("FERRY_TEST_S3_REGION"));
    std::env::set_var("AWS_ENDPOINT_URL", &s.endpoint);
    Some(s)
}

impl S3 {
    /// A fresh prefix per test.
    fn url(&self, test: &str) -> String {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("s3://{}/{test}-{n}", self.bucket)
    }
}

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let v: Vec<OsString> = args.iter().map(|a| a.as_ref().to_owned()).collect();
    ferry(&v)
}

/// A tree S3 can hold exactly: files (empty to multipart-sized) in nested
/// directories, nanosecond mtimes, a few modes. (No symlinks or empty
/// directories: object stores have neither.)
fn tree(root: &Path) {
    write(root, "a.txt", b"hello s3\n");
    write(root, "empty", b"");
    write(root, "d1/b.bin", &gen_bytes(70_000, 1));
    write(root, "d1/d2/c.bin", &gen_bytes(4096, 2));
    write(root, "d1/d2/sp ace+plus%.txt", b"odd name");
    write(root, "d3/unicode-\u{e9}\u{4e2d}.txt", b"utf8");
    write(root, "big.bin", &gen_bytes(17 * 1024 * 1024 + 5, 3));
    chmod(&root.join("a.txt"), 0o600);
    chmod(&root.join("d1/b.bin"), 0o755);
    stamp_tree(root, 1_500_000_000);
}

/// Files equal in bytes, mtime (ns) and mode; directories may differ in times.
fn assert_files_equal(a: &Path, b: &Path) {
    let files = |root: &Path| -> Vec<(std::path::PathBuf, Vec<u8>, Mtime, u32)> {
        use std::os::unix::fs::PermissionsExt;
        let mut v: Vec<_> = walk(root)
            .into_iter()
            .filter(|p| root.join(p).is_file())
            .map(|p| {
                let full = root.join(&p);
                let m = std::fs::metadata(&full).unwrap();
                (
                    p.clone(),
                    std::fs::read(&full).unwrap(),
                    get_mtime(&full),
                    m.permissions().mode() & 0o7777,
                )
            })
            .collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let (fa, fb) = (files(a), files(b));
    assert_eq!(
        fa.len(),
        fb.len(),
        "file counts differ: {:?} vs {:?}",
        fa.iter().map(|x| &x.0).collect::<Vec<_>>(),
        fb.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    for (x, y) in fa.iter().zip(&fb) {
        assert_eq!(x.0, y.0);
        assert!(x.1 == y.1, "{:?}: content differs", x.0);
        assert_eq!(x.2, y.2, "{:?}: mtime differs", x.0);
        assert_eq!(x.3, y.3, "{:?}: mode differs", x.0);
    }
}

#[test]
fn up_down_round_trip_and_resync_is_noop() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let url = s3.url("roundtrip");
    let up = run(&[&"sync", &"--json", &src, &url]);
    up.ok();
    let s = summary(&up);
    assert_eq!((s.files_copied, s.errors), (7, 0), "{up}");

    // Second upload: nothing to do (size + mtime from object metadata).
    let again = run(&[&"sync", &"--json", &src, &url]);
    again.ok();
    assert_eq!(summary(&again).files_copied, 0, "{again}");

    // Down into a fresh directory: equal files, mtimes, modes.
    let down = t.path().join("down");
    let r = run(&[&"sync", &"--json", &url, &down]);
    r.ok();
    assert_files_equal(&src, &down);
    let r = run(&[&"sync", &"--json", &url, &down]);
    r.ok();
    assert_eq!(summary(&r).files_copied, 0, "{r}");

    // ls lists every object with its size and mtime.
    let ls = run(&[&"ls", &url]);
    ls.ok();
    let out = String::from_utf8_lossy(&ls.stdout).to_string();
    let want = format!("9 {} a.txt", mtime_ns(get_mtime(&src.join("a.txt"))));
    assert!(out.lines().any(|l| l == want), "{want:?} not in:\n{out}");
    assert!(out.contains("d1/d2/sp ace+plus%.txt"), "{out}");
}

#[test]
fn sync_to_s3_deletes_and_updates() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let url = s3.url("edits");
    run(&[&"sync", &src, &url]).ok();
    // Edit: delete a file and a directory, change one, add one, chmod one.
    std::fs::remove_file(src.join("d1/b.bin")).unwrap();
    std::fs::remove_dir_all(src.join("d3")).unwrap();
    write(&src, "a.txt", b"changed content");
    write(&src, "new/x.txt", b"new");
    chmod(&src.join("empty"), 0o640);
    stamp_tree(&src, 1_600_000_000);
    let r = run(&[&"sync", &"--json", &src, &url]);
    r.ok();
    let down = t.path().join("down");
    run(&[&"sync", &url, &down]).ok();
    assert_files_equal(&src, &down);
    // copy never deletes: an extra object survives a copy, not a sync.
    let extra = t.path().join("extra");
    write(&extra, "only-in-dst.txt", b"x");
    run(&[&"copy", &extra, &url]).ok();
    let ls = run(&[&"ls", &url]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("only-in-dst.txt"));
    run(&[&"sync", &src, &url]).ok();
    let ls = run(&[&"ls", &url]);
    assert!(!String::from_utf8_lossy(&ls.stdout).contains("only-in-dst.txt"));
}

#[test]
fn s3_to_s3_and_checksum() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let a = s3.url("s2s-a");
    let b = s3.url("s2s-b");
    run(&[&"sync", &src, &a]).ok();
    run(&[&"sync", &a, &b]).ok();
    let down = t.path().join("down");
    run(&[&"sync", &b, &down]).ok();
    assert_files_equal(&src, &down);
    // Same size and mtime, other bytes: only --checksum sees it.
    rewrite_keep_meta(&src.join("a.txt"), b"HELLO S3\n");
    let r = run(&[&"sync", &"--json", &src, &a]);
    assert_eq!(summary(&r).files_copied, 0, "{r}");
    let r = run(&[&"sync", &"--json", &"--checksum", &src, &a]);
    assert_eq!(summary(&r).files_copied, 1, "{r}");
}

#[test]
fn bad_bucket_and_credentials_exit_2() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "f", b"f");
    let r = run(&[&"sync", &src, &"s3://no-such-bucket-ferry/x"]);
    r.code_is(2);
    assert!(r.err().contains("no-such-bucket-ferry"), "{r}");
    let out = Command::new(bin())
        .args(["ls", &s3.url("x")])
        .env("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(bin())
        .args([
            "ls",
            "s3://ferry-test/x",
            "--s3-endpoint",
            "http://127.0.0.1:9",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// rclone's view of a remote path: `size  YYYY-MM-DD HH:MM:SS.fffffffff path` per object.
fn rclone(s3: &S3, args: &[&str]) -> std::process::Output {
    let out = Command::new("rclone")
        .args(args)
        .env("RCLONE_CONFIG", "/dev/null")
        // A CA bundle variable makes rclone 1.60 refuse its own HTTP transport.
        .env_remove("AWS_CA_BUNDLE")
        .env("RCLONE_CONFIG_G_TYPE", "s3")
        .env("RCLONE_CONFIG_G_PROVIDER", "Other")
        .env(
            "RCLONE_CONFIG_G_ACCESS_KEY_ID",
            std::env::var("AWS_ACCESS_KEY_ID").unwrap(),
        )
        .env(
            "RCLONE_CONFIG_G_SECRET_ACCESS_KEY",
            std::env::var("AWS_SECRET_ACCESS_KEY").unwrap(),
        )
        .env("RCLONE_CONFIG_G_ENDPOINT", &s3.endpoint)
        .env(
            "RCLONE_CONFIG_G_REGION",
            std::env::var("AWS_REGION").unwrap(),
        )
        .env("RCLONE_CONFIG_G_FORCE_PATH_STYLE", "true")
        .output()
        .expect("rclone is installed by scripts/test");
    assert!(
        out.status.success(),
        "rclone {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn rclone_path(url: &str) -> String {
    format!("g:{}", url.strip_prefix("s3://").unwrap())
}

#[test]
fn rclone_reads_what_ferry_wrote_and_ferry_reads_what_rclone_wrote() {
    let Some(s3) = s3() else { return };
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);

    // ferry up, rclone down: rclone sees ferry's mtimes (X-Amz-Meta-Mtime).
    let url = s3.url("interop-ferry");
    run(&[&"sync", &src, &url]).ok();
    let down = t.path().join("rclone-down");
    rclone(&s3, &["copy", &rclone_path(&url), down.to_str().unwrap()]);
    for rel in ["a.txt", "d1/b.bin", "big.bin", "d1/d2/sp ace+plus%.txt"] {
        assert_eq!(
            std::fs::read(src.join(rel)).unwrap(),
            std::fs::read(down.join(rel)).unwrap(),
            "{rel}"
        );
        assert_eq!(
            get_mtime(&src.join(rel)),
            get_mtime(&down.join(rel)),
            "{rel}: mtime as rclone read it"
        );
    }
    // rclone agrees nothing differs (size and mtime).
    rclone(
        &s3,
        &[
            "check",
            "--size-only",
            src.to_str().unwrap(),
            &rclone_path(&url),
        ],
    );

    // rclone up, ferry down: mtimes intact, nothing re-copied on the second run.
    let url2 = s3.url("interop-rclone");
    rclone(&s3, &["copy", src.to_str().unwrap(), &rclone_path(&url2)]);
    let mine = t.path().join("ferry-down");
    run(&[&"sync", &url2, &mine]).ok();
    for rel in [
        "a.txt",
        "d1/b.bin",
        "big.bin",
        "d3/unicode-\u{e9}\u{4e2d}.txt",
    ] {
        assert_eq!(
            std::fs::read(src.join(rel)).unwrap(),
            std::fs::read(mine.join(rel)).unwrap(),
            "{rel}"
        );
        assert_eq!(
            get_mtime(&src.join(rel)),
            get_mtime(&mine.join(rel)),
            "{rel}: mtime from rclone's metadata"
        );
    }
    let again = run(&[&"sync", &"--json", &url2, &mine]);
    again.ok();
    assert_eq!(summary(&again).files_copied, 0, "{again}");
    // And ferry uploading over rclone's objects finds them unchanged.
    let up = run(&[&"sync", &"--json", &src, &url2]);
    assert_eq!(summary(&up).files_copied, 0, "{up}");
}
