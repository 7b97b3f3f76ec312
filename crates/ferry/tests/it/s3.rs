//! ferry against real S3 servers: the single-node Garage and moto's server
//! that `scripts/test` starts (see scripts/garage, scripts/moto), found
//! through `FERRY_TEST_S3_*` and `FERRY_TEST_S3M_*` variables; each test runs
//! once per server. Without Garage's these tests fail, unless
//! `FERRY_SKIP_S3=1` says to skip them on purpose.

use std::path::Path;
use std::process::Command;

use crate::util::s3::*;
use crate::util::*;

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

#[test]
fn up_down_round_trip_and_resync_is_noop() {
    each_server(up_down_round_trip_and_resync_is_noop_on);
}

fn up_down_round_trip_and_resync_is_noop_on(s3: &S3) {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let url = s3.url("roundtrip");
    let up = s3.run(&[&"sync", &"--json", &src, &url]);
    up.ok();
    let s = summary(&up);
    assert_eq!((s.files_copied, s.errors), (7, 0), "{up}");

    // Second upload: nothing to do (size + mtime from object metadata).
    let again = s3.run(&[&"sync", &"--json", &src, &url]);
    again.ok();
    assert_eq!(summary(&again).files_copied, 0, "{again}");

    // Down into a fresh directory: equal files, mtimes, modes.
    let down = t.path().join("down");
    let r = s3.run(&[&"sync", &"--json", &url, &down]);
    r.ok();
    assert_files_equal(&src, &down);
    let r = s3.run(&[&"sync", &"--json", &url, &down]);
    r.ok();
    assert_eq!(summary(&r).files_copied, 0, "{r}");

    // ls lists every object with its size and mtime.
    let ls = s3.run(&[&"ls", &url]);
    ls.ok();
    let out = String::from_utf8_lossy(&ls.stdout).to_string();
    let want = format!("9 {} a.txt", mtime_ns(get_mtime(&src.join("a.txt"))));
    assert!(out.lines().any(|l| l == want), "{want:?} not in:\n{out}");
    assert!(out.contains("d1/d2/sp ace+plus%.txt"), "{out}");

    // --server-mtime: the same entries and sizes from the listing alone,
    // each object's upload time instead of its stored mtime, no mode.
    let fast = s3.run(&[&"ls", &"--server-mtime", &url]);
    fast.ok();
    let fast_out = String::from_utf8_lossy(&fast.stdout).to_string();
    let strip = |text: &str| -> Vec<(String, String)> {
        let mut v: Vec<_> = text
            .lines()
            .map(|l| {
                let mut f = l.splitn(3, ' ');
                let size = f.next().unwrap().to_string();
                let _mtime = f.next();
                (f.next().unwrap().to_string(), size)
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(strip(&fast_out), strip(&out));
    let uploaded_after = 1_600_000_000u64 * 1_000_000_000;
    for l in fast_out.lines().filter(|l| !l.ends_with('/')) {
        let t: u64 = l.split(' ').nth(1).unwrap().parse().unwrap();
        assert!(
            t > uploaded_after,
            "stored mtime shown instead of the upload time: {l}"
        );
    }
    let json = s3.run(&[&"ls", &"--server-mtime", &"--json", &url]);
    json.ok();
    let json = String::from_utf8_lossy(&json.stdout).to_string();
    assert!(
        json.contains("\"path\":\"a.txt\"") && !json.contains("\"mode\""),
        "{json}"
    );
}

#[test]
fn sync_to_s3_deletes_and_updates() {
    each_server(sync_to_s3_deletes_and_updates_on);
}

fn sync_to_s3_deletes_and_updates_on(s3: &S3) {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let url = s3.url("edits");
    s3.run(&[&"sync", &src, &url]).ok();
    // Edit: delete a file and a directory, change one, add one, chmod one.
    std::fs::remove_file(src.join("d1/b.bin")).unwrap();
    std::fs::remove_dir_all(src.join("d3")).unwrap();
    write(&src, "a.txt", b"changed content");
    write(&src, "new/x.txt", b"new");
    chmod(&src.join("empty"), 0o640);
    stamp_tree(&src, 1_600_000_000);
    let r = s3.run(&[&"sync", &"--json", &src, &url]);
    r.ok();
    let down = t.path().join("down");
    s3.run(&[&"sync", &url, &down]).ok();
    assert_files_equal(&src, &down);
    // copy never deletes: an extra object survives a copy, not a sync.
    let extra = t.path().join("extra");
    write(&extra, "only-in-dst.txt", b"x");
    s3.run(&[&"copy", &extra, &url]).ok();
    let ls = s3.run(&[&"ls", &url]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("only-in-dst.txt"));
    s3.run(&[&"sync", &src, &url]).ok();
    let ls = s3.run(&[&"ls", &url]);
    assert!(!String::from_utf8_lossy(&ls.stdout).contains("only-in-dst.txt"));
}

#[test]
fn a_directory_wider_than_a_page_is_deleted_in_batches() {
    each_server(a_directory_wider_than_a_page_is_deleted_in_batches_on);
}

fn a_directory_wider_than_a_page_is_deleted_in_batches_on(s3: &S3) {
    // Pages of 100 keys: 234 objects make three.
    let s3 = &s3.paged(100);
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "keep.txt", b"kept");
    for i in 0..234 {
        write(&src, format!("gone/sub{}/f{i:05}", i % 3), b"");
    }
    write(&src, "gone-not/x", b"a sibling whose name starts the same");
    let url = s3.url("batchdel");
    s3.run(&[&"sync", &src, &url]).ok();
    std::fs::remove_dir_all(src.join("gone")).unwrap();
    let r = s3.run(&[&"sync", &"--json", &"-v", &src, &url]);
    r.ok();
    // The directory and its 234 objects (three listing pages), in one
    // DeleteObjects request per page.
    assert_eq!(summary(&r).files_deleted, 235, "{r}");
    let err = String::from_utf8_lossy(&r.stderr).to_string();
    assert!(err.contains(" 3 batch deletes"), "{err}");
    let ls = s3.run(&[&"ls", &"--server-mtime", &url]);
    ls.ok();
    let mut out: Vec<String> = String::from_utf8_lossy(&ls.stdout)
        .lines()
        .map(|l| l.splitn(3, ' ').nth(2).unwrap().to_string())
        .collect();
    out.sort();
    assert_eq!(out, ["gone-not/", "gone-not/x", "keep.txt"]);
}

#[test]
fn s3_to_s3_and_checksum() {
    each_server(s3_to_s3_and_checksum_on);
}

fn s3_to_s3_and_checksum_on(s3: &S3) {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let a = s3.url("s2s-a");
    let b = s3.url("s2s-b");
    s3.run(&[&"sync", &src, &a]).ok();
    s3.run(&[&"sync", &a, &b]).ok();
    let down = t.path().join("down");
    s3.run(&[&"sync", &b, &down]).ok();
    assert_files_equal(&src, &down);
    // Same size and mtime, other bytes: only --checksum sees it.
    rewrite_keep_meta(&src.join("a.txt"), b"HELLO S3\n");
    let r = s3.run(&[&"sync", &"--json", &src, &a]);
    assert_eq!(summary(&r).files_copied, 0, "{r}");
    let r = s3.run(&[&"sync", &"--json", &"--checksum", &src, &a]);
    assert_eq!(summary(&r).files_copied, 1, "{r}");
}

/// A wrong bucket, wrong credentials or an endpoint nobody listens on: exit 2, one line
/// that names the `s3://` path and the endpoint and says what the answer means.
#[test]
fn bad_bucket_credentials_and_endpoint_exit_2_saying_what_it_means() {
    each_server(|s3| {
        let t = tmpdir();
        let src = t.path().join("src");
        write(&src, "f", b"f");
        let r = s3.run(&[&"sync", &src, &"s3://no-such-bucket-ferry/x"]);
        r.code_is(2);
        let e = r.err();
        assert!(
            e.contains("s3://no-such-bucket-ferry") && e.contains("no such bucket"),
            "{r}"
        );
        assert!(e.contains(&s3.endpoint), "names the endpoint: {r}");

        let mut c = s3.command();
        c.args([
            "ls",
            "s3://ferry-test/x",
            "--s3-endpoint",
            "http://127.0.0.1:9",
        ]);
        let r = run_within(c, std::time::Duration::from_secs(120));
        r.code_is(2);
        let e = r.err();
        assert!(
            e.contains("s3://ferry-test")
                && e.contains("endpoint http://127.0.0.1:9 not reachable: connection refused"),
            "{r}"
        );
    });
    // Wrong credentials: Garage checks signatures (moto's server does not).
    if let Some(s3) = servers().into_iter().find(|s| s.name == "garage") {
        let url = s3.url("x");
        let mut c = s3.command();
        c.args(["ls", &url])
            .env("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789");
        let r = run_within(c, std::time::Duration::from_secs(120));
        r.code_is(2);
        let e = r.err();
        assert!(
            e.contains("s3://ferry-test") && e.contains("access denied, check the credentials"),
            "{r}"
        );
        assert!(e.contains(&s3.endpoint), "names the endpoint: {r}");
        let mut c = s3.command();
        c.args(["ls", &url])
            .env("AWS_ACCESS_KEY_ID", "GKnosuchkey000000000");
        let r = run_within(c, std::time::Duration::from_secs(120));
        r.code_is(2);
        assert!(
            r.err().contains("access denied, check the credentials"),
            "{r}"
        );
    }
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
        .env("RCLONE_CONFIG_G_ACCESS_KEY_ID", &s3.key)
        .env("RCLONE_CONFIG_G_SECRET_ACCESS_KEY", &s3.secret)
        .env("RCLONE_CONFIG_G_ENDPOINT", &s3.endpoint)
        .env("RCLONE_CONFIG_G_REGION", &s3.region)
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
    each_server(rclone_reads_what_ferry_wrote_and_ferry_reads_what_rclone_wrote_on);
}

fn rclone_reads_what_ferry_wrote_and_ferry_reads_what_rclone_wrote_on(s3: &S3) {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);

    // ferry up, rclone down: rclone sees ferry's mtimes (X-Amz-Meta-Mtime).
    let url = s3.url("interop-ferry");
    s3.run(&[&"sync", &src, &url]).ok();
    let down = t.path().join("rclone-down");
    rclone(s3, &["copy", &rclone_path(&url), down.to_str().unwrap()]);
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
        s3,
        &[
            "check",
            "--size-only",
            src.to_str().unwrap(),
            &rclone_path(&url),
        ],
    );
    // And by content: the multipart object's MD5 is in X-Amz-Meta-Md5chksum, so rclone
    // checks every file's hash (none "could not be checked").
    let out = rclone(s3, &["check", src.to_str().unwrap(), &rclone_path(&url)]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !said.contains("could not be checked") && said.contains("7 matching files"),
        "{said}"
    );

    // rclone up, ferry down: mtimes intact, nothing re-copied on the second run.
    let url2 = s3.url("interop-rclone");
    rclone(s3, &["copy", src.to_str().unwrap(), &rclone_path(&url2)]);
    let mine = t.path().join("ferry-down");
    s3.run(&[&"sync", &url2, &mine]).ok();
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
    let again = s3.run(&[&"sync", &"--json", &url2, &mine]);
    again.ok();
    assert_eq!(summary(&again).files_copied, 0, "{again}");
    // And ferry uploading over rclone's objects finds them unchanged.
    let up = s3.run(&[&"sync", &"--json", &src, &url2]);
    assert_eq!(summary(&up).files_copied, 0, "{up}");
}

/// Base64 of the MD5 of a file's content (rclone's `X-Amz-Meta-Md5chksum`), by Python.
fn md5_base64(p: &Path) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import base64,hashlib,sys; print(base64.b64encode(hashlib.md5(open(sys.argv[1],'rb').read()).digest()).decode())",
        ])
        .arg(p)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `2026-11-23T00:33:01.123000+00:00` or `...Z` (UTC) → (seconds, nanoseconds).
fn parse_utc(s: &str) -> Mtime {
    let n = |r: std::ops::Range<usize>| -> i64 { s[r].parse().unwrap_or_else(|_| panic!("{s}")) };
    let (y, mo, d, h, mi, se) = (n(0..4), n(5..7), n(8..10), n(11..13), n(14..16), n(17..19));
    let tz = s[19..].trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    assert!(tz == "Z" || tz == "+00:00", "not UTC: {s}");
    let frac: String = s[19..]
        .strip_prefix('.')
        .unwrap_or("")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let ns: u32 = format!("{frac:0<9}")[..9].parse().unwrap();
    // Days since the epoch (proleptic Gregorian), Howard Hinnant's algorithm.
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    (days * 86_400 + h * 3600 + mi * 60 + se, ns)
}

#[test]
fn parse_utc_reads_aws_cli_timestamps() {
    assert_eq!(parse_utc("1970-01-01T00:00:00+00:00"), (0, 0));
    assert_eq!(
        parse_utc("2020-09-13T12:26:40.123000+00:00"),
        (1_600_000_000, 123_000_000)
    );
    assert_eq!(parse_utc("2000-03-01T00:00:01Z"), (951_868_801, 0));
}

/// [`tree`] and keys that need encoding: `+`, `%`, unicode and an emoji.
fn odd_tree(src: &Path) {
    tree(src);
    write(src, "odd/plus+sign", b"plus");
    write(src, "odd/100%", b"percent");
    write(
        src,
        "odd/\u{65e5}\u{672c}\u{8a9e} \u{1f600}.txt",
        b"unicode",
    );
}

/// Odd keys and a multipart-sized object, as ferry writes them, read by the AWS CLI: the
/// listing has exactly ferry's keys and sizes, a recursive download has the same bytes, and
/// the object metadata carries mtime and mode in rclone's format.
#[test]
fn aws_cli_reads_what_ferry_wrote() {
    each_server(aws_cli_reads_what_ferry_wrote_on);
}

fn aws_cli_reads_what_ferry_wrote_on(s3: &S3) {
    let t = tmpdir();
    let src = t.path().join("src");
    odd_tree(&src);
    write(&src, "odd/two  spaces.txt", b"spaces");
    stamp_tree(&src, 1_500_000_000);
    let url = s3.url("awscli-ferry");
    let (bucket, prefix) = split_url(&url);
    s3.run(&[&"sync", &src, &url]).ok();

    let want: Vec<(String, u64)> = file_list(&src)
        .into_iter()
        .map(|(p, data, _, _)| {
            (
                format!("{prefix}/{}", p.to_str().unwrap()),
                data.len() as u64,
            )
        })
        .collect();
    let ls = aws(s3, &["s3", "ls", "--recursive", &format!("{url}/")]);
    // `2026-11-23 00:33:01      12345 prefix/key`
    let mut got: Vec<(String, u64)> = String::from_utf8(ls.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (size, key) = l[19..].trim_start().split_once(' ').unwrap();
            (key.to_owned(), size.parse().unwrap())
        })
        .collect();
    got.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(got, want_sorted, "aws s3 ls --recursive");

    let down = t.path().join("aws-down");
    aws(
        s3,
        &[
            "s3",
            "cp",
            "--recursive",
            "--only-show-errors",
            &format!("{url}/"),
            down.to_str().unwrap(),
        ],
    );
    let bytes = |root: &Path| -> Vec<(std::path::PathBuf, Vec<u8>)> {
        file_list(root)
            .into_iter()
            .map(|(p, data, _, _)| (p, data))
            .collect()
    };
    let (a, b) = (bytes(&src), bytes(&down));
    assert_eq!(
        a.iter().map(|x| &x.0).collect::<Vec<_>>(),
        b.iter().map(|x| &x.0).collect::<Vec<_>>(),
        "aws s3 cp --recursive downloaded other files"
    );
    for (x, y) in a.iter().zip(&b) {
        assert!(x.1 == y.1, "{:?}: aws s3 cp downloaded other bytes", x.0);
    }

    for (rel, mode) in [
        ("a.txt", "100600"),
        ("big.bin", "100644"),
        ("d1/b.bin", "100755"),
    ] {
        let head = aws(
            s3,
            &[
                "s3api",
                "head-object",
                "--output",
                "json",
                "--bucket",
                bucket,
                "--key",
                &format!("{prefix}/{rel}"),
            ],
        );
        let j = parse_json(&String::from_utf8(head.stdout).unwrap()).unwrap();
        let meta = j.get("Metadata").expect("Metadata in head-object");
        let (sec, nsec) = get_mtime(&src.join(rel));
        assert_eq!(
            meta.str_field("mtime"),
            Some(format!("{sec}.{nsec:09}").as_str()),
            "{rel}: x-amz-meta-mtime in rclone's format (seconds.nanoseconds)"
        );
        assert_eq!(meta.str_field("mode"), Some(mode), "{rel}: x-amz-meta-mode");
        if rel == "big.bin" {
            // Multipart: rclone's whole-file MD5 (its ETag is not one).
            assert_eq!(
                meta.str_field("md5chksum"),
                Some(md5_base64(&src.join(rel)).as_str()),
                "{rel}: x-amz-meta-md5chksum"
            );
        }
        assert_eq!(
            j.get("ContentLength").and_then(Json::as_u64),
            Some(std::fs::metadata(src.join(rel)).unwrap().len()),
            "{rel}"
        );
    }
}

/// A tree the AWS CLI uploaded (no ferry metadata, multipart by the CLI's own part size) is
/// synced down by ferry with the same bytes, each file's mtime the object's LastModified
/// (or its `mtime` metadata when the uploader set one), and a second sync copies nothing.
#[test]
fn ferry_reads_what_aws_cli_wrote() {
    each_server(ferry_reads_what_aws_cli_wrote_on);
}

fn ferry_reads_what_aws_cli_wrote_on(s3: &S3) {
    let t = tmpdir();
    let src = t.path().join("src");
    odd_tree(&src);
    let url = s3.url("awscli-up");
    let (bucket, prefix) = split_url(&url);
    aws(
        s3,
        &[
            "s3",
            "cp",
            "--recursive",
            "--only-show-errors",
            src.to_str().unwrap(),
            &format!("{url}/"),
        ],
    );
    // One object with rclone-style metadata set by the uploader.
    let meta_file = write(t.path(), "with-meta", b"metadata from the AWS CLI");
    aws(
        s3,
        &[
            "s3",
            "cp",
            "--only-show-errors",
            "--metadata",
            "mtime=1234567890.123456789,mode=100640",
            meta_file.to_str().unwrap(),
            &format!("{url}/meta/with-meta"),
        ],
    );

    let down = t.path().join("down");
    let r = s3.run(&[&"sync", &"--json", &url, &down]);
    r.ok();
    assert_eq!(summary(&r).errors, 0, "{r}");

    let listing = aws(
        s3,
        &[
            "s3api",
            "list-objects-v2",
            "--output",
            "json",
            "--bucket",
            bucket,
            "--prefix",
            &format!("{prefix}/"),
        ],
    );
    let j = parse_json(&String::from_utf8(listing.stdout).unwrap()).unwrap();
    let Some(Json::Array(objects)) = j.get("Contents") else {
        panic!("no Contents in {j:?}")
    };
    let mut last_modified = std::collections::BTreeMap::new();
    for o in objects {
        let key = o.str_field("Key").unwrap();
        let rel = key.strip_prefix(&format!("{prefix}/")).unwrap().to_owned();
        last_modified.insert(rel, parse_utc(o.str_field("LastModified").unwrap()));
    }

    let mut got = file_list(&down);
    let meta_entry = got
        .iter()
        .position(|x| x.0 == Path::new("meta/with-meta"))
        .expect("meta/with-meta downloaded");
    let (_, data, mtime, mode) = got.remove(meta_entry);
    assert_eq!(data, b"metadata from the AWS CLI");
    assert_eq!(
        mtime,
        (1_234_567_890, 123_456_789),
        "mtime from x-amz-meta-mtime"
    );
    assert_eq!(mode, 0o640, "mode from x-amz-meta-mode");

    let want = file_list(&src);
    assert_eq!(
        want.iter().map(|x| &x.0).collect::<Vec<_>>(),
        got.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    for (w, g) in want.iter().zip(&got) {
        let rel = w.0.to_str().unwrap();
        assert!(w.1 == g.1, "{rel}: content differs");
        assert_eq!(
            g.2, last_modified[rel],
            "{rel}: mtime is not the object's LastModified"
        );
        assert_eq!(g.3, 0o644, "{rel}: mode of an object without mode metadata");
    }

    let again = s3.run(&[&"sync", &"--json", &url, &down]);
    again.ok();
    assert_eq!(summary(&again).files_copied, 0, "{again}");
}

/// A directory prefix wider than one listing page (pages of 100 keys
/// here, as of 1,000 on servers left to their default) is listed in
/// parallel ranges after its first page: every object exactly once,
/// whatever its names look like (a counter the range guesses fit, names
/// they do not, subdirectories between them), and a re-sync finds
/// nothing to do.
#[test]
fn wide_prefix_listed_in_ranges() {
    each_server(wide_prefix_listed_in_ranges_on);
}

fn wide_prefix_listed_in_ranges_on(s3: &S3) {
    let s3 = &s3.paged(100);
    let t = tmpdir();
    let src = t.path().join("src");
    let mut want = Vec::new();
    for i in 0..230 {
        // Counter names, then names the first page says nothing about.
        let name = if i < 180 {
            format!("f{i:05}")
        } else {
            format!("{}x{i}", ["f1", "g", "z", "é", "f00"][i % 5])
        };
        write(&src, &name, name.as_bytes());
        want.push(name);
    }
    for d in ["f00050d", "f00150x", "m"] {
        write(&src, format!("{d}/inner"), b"i");
        want.push(format!("{d}/inner"));
    }
    stamp_tree(&src, 1_500_000_000);
    let url = s3.url("wide");
    s3.run(&[&"copy", &src, &url]).ok();
    let ls = s3.run(&[&"ls", &url]);
    ls.ok();
    let out = String::from_utf8_lossy(&ls.stdout).to_string();
    let mut got: Vec<String> = out
        .lines()
        .filter_map(|l| l.splitn(3, ' ').nth(2))
        .filter(|p| !p.ends_with('/'))
        .map(str::to_string)
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "listing differs from what was uploaded");
    let r = s3.run(&[&"sync", &"--json", &src, &url]);
    r.ok();
    assert_eq!(summary(&r).files_copied, 0, "{r}");
    let down = t.path().join("down");
    let r = s3.run(&[&"sync", &"-v", &url, &down]);
    r.ok();
    assert_files_equal(&src, &down);
    // The first page (f00000…f00099) gave boundaries f01…f09, f1…f9: ranges.
    let ranges: u64 = r
        .err()
        .lines()
        .find(|l| l.starts_with("ferry: s3 source:"))
        .and_then(|l| {
            l.split(", ")
                .find(|f| f.ends_with("listing ranges in parallel"))
        })
        .and_then(|f| f.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no range count\n{r}"));
    assert!(ranges >= 10, "{r}");
}

/// The filters work the same with S3 on either side: `--max-size` leaves out
/// big files when uploading and downloading, and never deletes what it
/// leaves out on the destination; `--max-age` reads the mtime ferry keeps in
/// the object's metadata, not the upload time.
#[test]
fn filters_with_s3_source_and_destination() {
    each_server(filters_with_s3_source_and_destination_on);
}

fn filters_with_s3_source_and_destination_on(s3: &S3) {
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "small", &gen_bytes(100, 1));
    write(&src, "d/tiny", &gen_bytes(10, 2));
    write(&src, "big", &gen_bytes(5000, 3));
    stamp_tree(&src, 1_500_000_000);
    let url = s3.url("filters");
    let keys = |r: &Run| -> Vec<String> {
        let mut v: Vec<String> = r
            .out()
            .lines()
            .filter_map(|l| l.splitn(3, ' ').nth(2))
            .filter(|p| !p.ends_with('/'))
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };

    // Destination S3: big is not uploaded; an object too big to be in the
    // run is not deleted by sync, a small one only there is.
    let other = t.path().join("other");
    write(&other, "big-dst-only", &gen_bytes(6000, 4));
    write(&other, "stray", b"x");
    stamp_tree(&other, 1_400_000_000);
    s3.run(&[&"copy", &other, &url]).ok();
    s3.run(&[&"sync", &"--max-size", &"1K", &src, &url]).ok();
    let ls = s3.run(&[&"ls", &url]);
    ls.ok();
    assert_eq!(keys(&ls), ["big-dst-only", "d/tiny", "small"], "{ls}");

    // Source S3: only what is at most 50 bytes comes down; a big local file
    // only in DST stays, a small one goes.
    let down = t.path().join("down");
    write(&down, "keep-big", &gen_bytes(5000, 5));
    write(&down, "stray", b"y");
    s3.run(&[&"sync", &"--max-size", &"50", &url, &down]).ok();
    let mut got: Vec<String> = walk(&down)
        .into_iter()
        .filter(|p| down.join(p).is_file())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    got.sort();
    assert_eq!(got, ["d/tiny", "keep-big"]);
    assert_eq!(
        std::fs::read(down.join("d/tiny")).unwrap(),
        gen_bytes(10, 2)
    );

    // The objects were uploaded just now, their files' mtimes are from
    // 2014 and 2017: --max-age 1d takes none of them, --min-age 1d all.
    let young = t.path().join("young");
    s3.run(&[&"copy", &"--max-age", &"1d", &url, &young]).ok();
    assert!(walk(&young).iter().all(|p| !young.join(p).is_file()));
    let old = t.path().join("old");
    s3.run(&[&"copy", &"--min-age", &"1d", &url, &old]).ok();
    assert_eq!(
        walk(&old).iter().filter(|p| old.join(p).is_file()).count(),
        3
    );
}

/// `--backup-dir` on S3 keeps by a server-side copy (nothing downloaded):
/// what a sync replaces or deletes is afterwards under the backup prefix,
/// byte-equal; `--versions` keeps in `.ferry-versions/` of the prefix,
/// which `ferry versions` lists and no sync ever copies.
#[test]
fn sync_to_s3_keeps_what_it_replaces_and_deletes() {
    each_server(sync_to_s3_keeps_what_it_replaces_and_deletes_on);
}

fn sync_to_s3_keeps_what_it_replaces_and_deletes_on(s3: &S3) {
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "a.txt", b"first a");
    write(&src, "d/b.txt", b"first b");
    write(&src, "c.txt", b"unchanged c");
    stamp_tree(&src, 1_500_000_000);
    let url = s3.url("keep");
    let old = s3.url("keep-old");
    s3.run(&[&"sync", &src, &url]).ok();

    write(&src, "a.txt", b"second a, longer");
    std::fs::remove_dir_all(src.join("d")).unwrap();
    let r = s3.run(&[&"sync", &"--json", &"--backup-dir", &old, &src, &url]);
    r.ok();
    let kept: Vec<_> = json_lines(&r)
        .into_iter()
        .filter(|j| j.str_field("type") == Some("keep"))
        .collect();
    assert_eq!(kept.len(), 2, "{r}");
    let back = t.path().join("back");
    s3.run(&[&"sync", &old, &back]).ok();
    assert_eq!(std::fs::read(back.join("a.txt")).unwrap(), b"first a");
    assert_eq!(std::fs::read(back.join("d/b.txt")).unwrap(), b"first b");
    assert!(!back.join("c.txt").exists(), "an unchanged file was kept");
    let now = t.path().join("now");
    s3.run(&[&"sync", &url, &now]).ok();
    assert_files_equal(&src, &now);

    // --versions: kept inside the prefix, listed, never synced.
    write(&src, "a.txt", b"third a, longer still");
    s3.run(&[&"sync", &"--versions", &src, &url]).ok();
    let v = s3.run(&[&"versions", &format!("{url}/a.txt")]);
    v.ok();
    let out = String::from_utf8_lossy(&v.stdout).to_string();
    assert_eq!(
        out.lines()
            .filter(|l| l.contains(".ferry-versions"))
            .count(),
        1,
        "{v}"
    );
    let again = t.path().join("again");
    s3.run(&[&"sync", &url, &again]).ok();
    assert!(
        !again.join(".ferry-versions").exists(),
        "versions were synced"
    );
    assert_files_equal(&src, &again);
}
