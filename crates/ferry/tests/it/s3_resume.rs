//! Big objects against the real S3 servers of `scripts/test` (Garage and moto, each):
//! interrupted uploads and downloads resume without re-sending what is
//! already there, S3 → S3 copies stay on the server, `--checksum` compares
//! multipart ETags without downloading, `ferry cleanup` aborts leftovers.
//! Needs `FERRY_TEST_S3_*` (or `FERRY_SKIP_S3=1` to skip on purpose).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::util::s3::{cutting_proxy, each_server, S3};
use crate::util::*;

/// A work dir on the disk of the build (user xattrs: not always on /tmp).
fn workdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// `N` from the first "... N <what>" in ferry's `-v` notes whose line
/// starts with `ferry: <line>`.
fn count_in(r: &Run, line: &str, what: &str) -> u64 {
    let err = String::from_utf8_lossy(&r.stderr);
    let head = format!("ferry: {line}");
    for l in err.lines().filter(|l| l.starts_with(&head)) {
        for part in l[head.len()..].trim_start_matches(": ").split(", ") {
            if let Some(n) = part.strip_suffix(what) {
                if let Some(n) = n.split_whitespace().next().and_then(|n| n.parse().ok()) {
                    return n;
                }
            }
        }
    }
    panic!("no \"{what}\" in the output:\n{r}");
}

/// `N` from "N <what>" in the `-v` note about the S3 destination.
fn count(r: &Run, what: &str) -> u64 {
    count_in(r, "s3 destination", what)
}

/// Kill `child` with SIGKILL once `cond` holds or `max` passed.
fn kill_when(mut child: Child, max: Duration, cond: impl Fn() -> bool) {
    let t = Instant::now();
    while t.elapsed() < max && !cond() && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn big_file(dir: &Path, name: &str, len: usize, seed: u64) -> PathBuf {
    let p = write(dir, name, &gen_bytes(len, seed));
    set_mtime(&p, (1_600_000_000, 123_456_789));
    p
}

#[test]
fn killed_upload_resumes_its_multipart_upload() {
    each_server(killed_upload_resumes_its_multipart_upload_on);
}

fn killed_upload_resumes_its_multipart_upload_on(s3: &S3) {
    let w = workdir();
    let src = w.path().join("src");
    big_file(&src, "big.bin", 48 << 20, 7);
    let url = s3.url("resume-up");
    // Paced at 8 MiB/s: 6 s in all; killed after 3 s, a few parts are up.
    let child = s3.spawn(["copy", "--bwlimit", "8M", src.to_str().unwrap(), &url]);
    kill_when(child, Duration::from_secs(3), || false);
    let pending = s3.ferry(["cleanup", "-n", "--max-age", "0", &url]);
    assert_eq!(pending.code, Some(0), "{pending}");
    assert!(
        String::from_utf8_lossy(&pending.stdout).contains("big.bin"),
        "the killed run left its upload: {pending}"
    );
    let r = s3.ferry(["copy", "-v", src.to_str().unwrap(), &url]);
    assert_eq!(r.code, Some(0), "{r}");
    let reused = count(&r, "parts reused from 1 resumed upload(s)");
    let sent = count(&r, "parts sent");
    assert!(reused >= 1, "no part reused: {r}");
    assert_eq!(reused + sent, 6, "{r}");
    // What is on the server is the file, with its mtime.
    let down = w.path().join("down");
    let r = s3.ferry(["copy", &url, down.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(
        std::fs::read(down.join("big.bin")).unwrap(),
        std::fs::read(src.join("big.bin")).unwrap()
    );
    assert_eq!(
        get_mtime(&down.join("big.bin")),
        get_mtime(&src.join("big.bin"))
    );
    // Nothing is left pending.
    let pending = s3.ferry(["cleanup", "-n", "--max-age", "0", &url]);
    assert!(
        !String::from_utf8_lossy(&pending.stdout).contains("big.bin"),
        "{pending}"
    );
}

#[test]
fn resumed_upload_of_a_changed_file_resends_changed_parts_only() {
    each_server(resumed_upload_of_a_changed_file_resends_changed_parts_only_on);
}

fn resumed_upload_of_a_changed_file_resends_changed_parts_only_on(s3: &S3) {
    let w = workdir();
    let src = w.path().join("src");
    let p = big_file(&src, "f.bin", 40 << 20, 3);
    let url = s3.url("resume-changed");
    let child = s3.spawn(["copy", "--bwlimit", "8M", src.to_str().unwrap(), &url]);
    kill_when(child, Duration::from_secs(3), || false);
    // Change the first part's bytes (same size) and the mtime.
    let mut data = std::fs::read(&p).unwrap();
    data[100] ^= 0xff;
    std::fs::write(&p, &data).unwrap();
    set_mtime(&p, (1_700_000_000, 5));
    let r = s3.ferry(["copy", "-v", src.to_str().unwrap(), &url]);
    assert_eq!(r.code, Some(0), "{r}");
    let reused = count(&r, "parts reused from 1 resumed upload(s)");
    let sent = count(&r, "parts sent");
    assert!(sent >= 1, "the changed first part is sent again: {r}");
    assert_eq!(reused + sent, 5, "{r}");
    let down = w.path().join("down");
    let r = s3.ferry(["copy", &url, down.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(std::fs::read(down.join("f.bin")).unwrap(), data);
    assert_eq!(get_mtime(&down.join("f.bin")), (1_700_000_000, 5));
}

#[test]
fn killed_download_resumes_from_its_partial_file() {
    each_server(killed_download_resumes_from_its_partial_file_on);
}

fn killed_download_resumes_from_its_partial_file_on(s3: &S3) {
    let w = workdir();
    let src = w.path().join("src");
    big_file(&src, "big.bin", 96 << 20, 11);
    let url = s3.url("resume-down");
    let r = s3.ferry(["copy", src.to_str().unwrap(), &url]);
    assert_eq!(r.code, Some(0), "{r}");
    let down = w.path().join("down");
    // 24 MiB/s: 4 s in all; the received ranges are recorded every second.
    let child = s3.spawn(["copy", "--bwlimit", "24M", &url, down.to_str().unwrap()]);
    kill_when(child, Duration::from_secs(3), || false);
    let partials = find_prefixed(&down, b".ferry-part-");
    assert_eq!(partials.len(), 1, "one partial download kept: {partials:?}");
    assert!(!down.join("big.bin").exists());
    let r = s3.ferry(["copy", "-v", &url, down.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{r}");
    let reused = count_in(&r, "", "bytes of interrupted downloads reused");
    assert!(reused >= 16 << 20, "{reused} bytes reused: {r}");
    // Plain http: the ranges came on the direct path, none through ureq.
    assert!(
        count_in(&r, "s3 source", "ranged GETs on the direct path") > 0,
        "{r}"
    );
    assert_eq!(
        count_in(&r, "s3 source", "sent again through the HTTP client"),
        0,
        "{r}"
    );
    assert_eq!(
        std::fs::read(down.join("big.bin")).unwrap(),
        std::fs::read(src.join("big.bin")).unwrap()
    );
    assert_eq!(
        get_mtime(&down.join("big.bin")),
        get_mtime(&src.join("big.bin"))
    );
    assert!(find_prefixed(&down, b".ferry-").is_empty());
    // A second run changes nothing.
    let r = s3.ferry(["copy", "--json", &url, down.to_str().unwrap()]);
    assert_eq!(summary(&r).files_copied, 0, "{r}");
}

#[test]
fn s3_to_s3_copies_big_objects_on_the_server() {
    each_server(s3_to_s3_copies_big_objects_on_the_server_on);
}

fn s3_to_s3_copies_big_objects_on_the_server_on(s3: &S3) {
    let w = workdir();
    let src = w.path().join("src");
    big_file(&src, "big.bin", 20 << 20, 5);
    write(&src, "small.txt", b"small");
    let a = s3.url("ssc-a");
    let b = s3.url("ssc-b");
    assert_eq!(s3.ferry(["copy", src.to_str().unwrap(), &a]).code, Some(0));
    let r = s3.ferry(["copy", "-v", &a, &b]);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(count(&r, "server-side copies"), 2, "{r}");
    assert_eq!(count(&r, "parts sent"), 0, "{r}");
    let down = w.path().join("down");
    assert_eq!(s3.ferry(["copy", &b, down.to_str().unwrap()]).code, Some(0));
    for f in ["big.bin", "small.txt"] {
        assert_eq!(
            std::fs::read(down.join(f)).unwrap(),
            std::fs::read(src.join(f)).unwrap()
        );
        assert_eq!(get_mtime(&down.join(f)), get_mtime(&src.join(f)));
    }
}

#[test]
fn checksum_compares_multipart_etags_without_downloading() {
    each_server(checksum_compares_multipart_etags_without_downloading_on);
}

fn checksum_compares_multipart_etags_without_downloading_on(s3: &S3) {
    let w = workdir();
    let src = w.path().join("src");
    let p = big_file(&src, "big.bin", (17 << 20) + 3, 9);
    let url = s3.url("etag");
    assert_eq!(
        s3.ferry(["copy", src.to_str().unwrap(), &url]).code,
        Some(0)
    );
    let r = s3.ferry(["copy", "-c", "--json", src.to_str().unwrap(), &url]);
    assert_eq!(summary(&r).files_copied, 0, "{r}");
    // Same size and mtime, one byte different: only --checksum sees it.
    let mut data = std::fs::read(&p).unwrap();
    data[(9 << 20) + 1] ^= 1;
    rewrite_keep_meta(&p, &data);
    let r = s3.ferry(["copy", "--json", src.to_str().unwrap(), &url]);
    assert_eq!(summary(&r).files_copied, 0, "{r}");
    let r = s3.ferry(["copy", "-c", "--json", src.to_str().unwrap(), &url]);
    assert_eq!(summary(&r).files_copied, 1, "{r}");
    // And the other way: S3 → local with --checksum.
    let down = w.path().join("down");
    assert_eq!(
        s3.ferry(["copy", &url, down.to_str().unwrap()]).code,
        Some(0)
    );
    let r = s3.ferry(["copy", "-c", "--json", &url, down.to_str().unwrap()]);
    assert_eq!(summary(&r).files_copied, 0, "{r}");
}

#[test]
fn cleanup_aborts_only_old_enough_uploads() {
    // Not on moto's server: it reports one fixed start time (2010-11-10) for every upload,
    // so an upload's age cannot be told there.
    each_server(|s3| {
        if s3.name != "moto" {
            cleanup_aborts_only_old_enough_uploads_on(s3)
        }
    });
}

fn cleanup_aborts_only_old_enough_uploads_on(s3: &S3) {
    let w = workdir();
    let src = w.path().join("src");
    big_file(&src, "left.bin", 40 << 20, 2);
    let url = s3.url("cleanup");
    let child = s3.spawn(["copy", "--bwlimit", "8M", src.to_str().unwrap(), &url]);
    kill_when(child, Duration::from_secs(2), || false);
    let r = s3.ferry(["cleanup", &url]);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(
        !String::from_utf8_lossy(&r.stdout).contains("left.bin"),
        "younger than 24h: kept: {r}"
    );
    let r = s3.ferry(["cleanup", "--max-age", "0", &url]);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(
        String::from_utf8_lossy(&r.stdout).contains("aborted: "),
        "{r}"
    );
    let r = s3.ferry(["cleanup", "-n", "--max-age", "0", &url]);
    assert!(
        !String::from_utf8_lossy(&r.stdout).contains("left.bin"),
        "{r}"
    );
    let r = s3.ferry(["cleanup", "/tmp"]);
    assert_eq!(r.code, Some(2), "{r}");
}

#[test]
fn objects_are_headed_only_when_compared() {
    each_server(objects_are_headed_only_when_compared_on);
}

fn objects_are_headed_only_when_compared_on(s3: &S3) {
    let w = workdir();
    let src = w.path().join("src");
    for i in 0..20 {
        write(
            &src,
            format!("d{}/f{i}.txt", i % 3),
            format!("file {i}").as_bytes(),
        );
    }
    stamp_tree(&src, 1_600_000_000);
    let url = s3.url("heads");
    let r = s3.ferry(["copy", "-v", src.to_str().unwrap(), &url]);
    assert_eq!(
        count(&r, "HEAD requests"),
        0,
        "nothing to compare in an empty prefix: {r}"
    );
    let down = w.path().join("down");
    // First download: one GET per object, no HEAD; mtimes come from the GETs.
    let r = s3.ferry(["copy", "-v", &url, down.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(count_in(&r, "s3 source", "HEAD requests"), 0, "{r}");
    for p in walk(&src).into_iter().filter(|p| src.join(p).is_file()) {
        assert_eq!(get_mtime(&down.join(&p)), get_mtime(&src.join(&p)), "{p:?}");
    }
    // No-op re-sync: each object is compared, so HEADed once; nothing copied.
    let r = s3.ferry(["sync", "-v", "--json", &url, down.to_str().unwrap()]);
    assert_eq!(summary(&r).files_copied, 0, "{r}");
    assert_eq!(count_in(&r, "s3 source", "HEAD requests"), 20, "{r}");
    // A size change needs no HEAD to be seen (19 HEADs for the others);
    // the object replaced is HEADed once, right before its PUT (checked
    // at the act: docs/CLI.md).
    write(&src, "d0/f0.txt", b"a longer content than before");
    let r = s3.ferry(["copy", "-v", src.to_str().unwrap(), &url]);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(count(&r, "HEAD requests"), 20, "{r}");
}

/// The server goes away in the middle of a multipart upload and does not come back during
/// the run: the run ends (exit 1, the endpoint named) instead of waiting forever, and the
/// next run, with the server back, completes the upload.
#[test]
fn server_gone_mid_multipart_upload_ends_the_run() {
    each_server(|s3| {
        let w = workdir();
        let src = w.path().join("src");
        big_file(&src, "big.bin", 48 << 20, 21);
        let url = s3.url("gone-mid-upload");
        let proxy = cutting_proxy(&s3.endpoint, 20 << 20);
        let mut c = s3.command();
        c.args(["copy", src.to_str().unwrap(), &url, "--s3-endpoint", &proxy]);
        let r = run_within(c, Duration::from_secs(120));
        assert_eq!(r.code, Some(1), "{r}");
        assert!(r.err().contains(&proxy), "the endpoint is named: {r}");
        let r = s3.ferry(["copy", src.to_str().unwrap(), &url]);
        assert_eq!(r.code, Some(0), "{r}");
        let down = w.path().join("down");
        let r = s3.ferry(["copy", &url, down.to_str().unwrap()]);
        assert_eq!(r.code, Some(0), "{r}");
        assert!(
            std::fs::read(down.join("big.bin")).unwrap()
                == std::fs::read(src.join("big.bin")).unwrap()
        );
    });
}
