//! Hostile tests: s3_partial (see main.rs). Partial or odd answers of an S3 server, made by a
//! fault-injecting proxy in front of the real one (Garage, moto: `crate::util::s3proxy`): a listing
//! page that is empty, cut short, truncated without a token, with keys out of order or
//! outside the prefix, or with a token given twice, is an error for that listing and nothing
//! under it is deleted; keys no path can hold (`a//z`, `x/../y`) keep their directory; a URL
//! with an empty segment is refused; a server that stops answering mid-upload ends the run
//! with the timeout's error.

use std::time::Duration;

use crate::util::s3::{each_server, file_list, split_url, S3};
use crate::util::s3proxy::{Exchange, Fault, Proxy};
#[allow(unused_imports)]
use crate::util::*;

/// Objects of the listing tests: 300 names over 3 pages of 100 (`FERRY_TEST_S3_PAGE`), whose
/// first page spans two first letters, so the listing pages through in order (no ranges in
/// parallel): the second listing request with the delimiter is the second page.
fn names() -> Vec<String> {
    (0..300)
        .map(|i| format!("{}{i:03}", (b'a' + (i / 50) as u8) as char))
        .collect()
}

/// `ferry ARGS` against `s3`, through `endpoint` (bounded: a hang guard, not a timing).
fn via(s3: &S3, endpoint: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let mut c = s3.command();
    for a in args {
        c.arg(a);
    }
    c.args(["--s3-endpoint", endpoint]);
    run_within(c, Duration::from_secs(300))
}

/// Each element `<tag>…</tag>` of `body`, as (start of its text, end of its text).
fn elements(body: &str, tag: &str) -> Vec<(usize, usize)> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut v = Vec::new();
    let mut at = 0;
    while let Some(i) = body[at..].find(&open) {
        let s = at + i + open.len();
        let Some(j) = body[s..].find(&close) else {
            break;
        };
        v.push((s, s + j));
        at = s + j;
    }
    v
}

/// Decode `%XX` in a query value.
fn unpercent(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(x) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(x);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// The faults of a later listing page: (name, rule for the second page of a listing).
type Rewrite = fn(&Exchange, String) -> String;
fn page_faults() -> Vec<(&'static str, Option<Rewrite>)> {
    vec![
        // An empty 200 answer.
        ("an empty body", None),
        (
            "truncated without a token",
            Some(|_, b| {
                let t = elements(&b, "NextContinuationToken");
                assert_eq!(t.len(), 1, "page 2 has a token: {b}");
                let (s, e) = t[0];
                let open = "<NextContinuationToken>".len();
                let close = "</NextContinuationToken>".len();
                format!("{}{}", &b[..s - open], &b[e + close..])
            }),
        ),
        ("cut short", Some(|_, b| b[..b.len() / 2].to_string())),
        (
            "a key out of order",
            Some(|_, b| {
                // The last key of the page becomes its first one again.
                let k = elements(&b, "Key");
                let (f, l) = (k[0], k[k.len() - 1]);
                format!("{}{}{}", &b[..l.0], &b[f.0..f.1], &b[l.1..])
            }),
        ),
        (
            "a key outside the prefix",
            Some(|_, b| {
                let k = elements(&b, "Key");
                format!("{}elsewhere%2Fx{}", &b[..k[0].0], &b[k[0].1..])
            }),
        ),
        (
            "a token given twice",
            Some(|ex, b| {
                // The token the request came with, given again as the next one.
                let sent = unpercent(ex.query("continuation-token").expect("page 2 has a token"));
                let t = elements(&b, "NextContinuationToken");
                let (s, e) = t[0];
                format!("{}{sent}{}", &b[..s], &b[e..])
            }),
        ),
    ]
}

/// A proxy to `s3` that gives `fault` as the answer to the second listing request with the
/// delimiter (the second page of the root's listing).
fn faulty(s3: &S3, fault: Option<Rewrite>) -> Proxy {
    Proxy::start(&s3.endpoint, move |ex| {
        if ex.dir_list != 2 {
            return Fault::Pass;
        }
        match fault {
            None => Fault::Answer(200, String::new()),
            Some(f) => {
                let ex = ex.clone();
                Fault::Rewrite(Box::new(move |b| f(&ex, b)))
            }
        }
    })
}

/// The one error line of a listing that is not whole: it names the prefix listed and says why.
#[track_caller]
fn one_listing_error(r: &Run, url: &str, fault: &str) {
    let lines = r.error_lines();
    let bad: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("incomplete listing"))
        .collect();
    assert_eq!(
        bad.len(),
        1,
        "{fault}: one line says the listing is incomplete: {r}"
    );
    assert!(
        bad[0].contains(&format!("LIST {url}/: incomplete listing: page 2: ")),
        "{fault}: the line names the prefix and the page: {r}"
    );
    assert_eq!(lines.len(), 1, "{fault}: nothing else went wrong: {r}");
}

#[test]
fn an_incomplete_listing_is_an_error_and_deletes_nothing() {
    each_server(|s3| {
        let s3 = &s3.paged(100);
        let t = tmpdir();
        let src = t.path().join("src");
        for n in names() {
            write(&src, &n, n.as_bytes());
        }
        let url = s3.url("partial");
        s3.run(&[&"copy", &src, &url]).ok();
        // sync: DST as SRC is; every fault leaves it so, with exit 1 and one line.
        let dst = t.path().join("dst");
        s3.run(&[&"sync", &url, &dst]).ok();
        let before = file_list(&dst);
        assert_eq!(before.len(), 300);
        for (what, fault) in page_faults() {
            let p = faulty(s3, fault);
            let r = via(s3, &p.endpoint, &[&"sync", &url, &dst]);
            assert!(p.faults() > 0, "{what}: the fault was made: {r}");
            assert_eq!(r.code, Some(1), "{what}: {r}");
            one_listing_error(&r, &url, what);
            assert_eq!(file_list(&dst), before, "{what}: nothing deleted: {r}");
        }
        // ls and copy: the same line, exit 1.
        for (what, fault) in page_faults().into_iter().take(2) {
            let p = faulty(s3, fault);
            let r = via(s3, &p.endpoint, &[&"ls", &url]);
            assert_eq!(r.code, Some(1), "{what}: {r}");
            one_listing_error(&r, &url, what);
            let p = faulty(s3, fault);
            let r = via(s3, &p.endpoint, &[&"copy", &url, &t.path().join("c")]);
            assert_eq!(r.code, Some(1), "{what}: {r}");
            one_listing_error(&r, &url, what);
        }
        // bisync: A local, B the prefix, known to the journal; nothing deleted on either side.
        let a = t.path().join("a");
        let j = t.path().join("journal.db");
        for n in names() {
            write(&a, &n, n.as_bytes());
        }
        let burl = s3.url("partial-bisync");
        let bisync = |ep: &str| via(s3, ep, &[&"bisync", &"--journal", &j, &a, &burl]);
        bisync(&s3.endpoint).ok();
        bisync(&s3.endpoint).ok();
        let before = file_list(&a);
        for (what, fault) in page_faults() {
            let p = faulty(s3, fault);
            let r = bisync(&p.endpoint);
            assert!(p.faults() > 0, "{what}: the fault was made: {r}");
            assert_eq!(r.code, Some(1), "{what}: {r}");
            one_listing_error(&r, &burl, what);
            assert_eq!(file_list(&a), before, "{what}: nothing deleted on A: {r}");
            let down = t.path().join("down");
            let _ = std::fs::remove_dir_all(&down);
            s3.run(&[&"copy", &burl, &down]).ok();
            assert_eq!(
                file_list(&down).len(),
                300,
                "{what}: nothing deleted on B: {r}"
            );
        }
        // The server answering whole again, the next run has nothing to do.
        let r = bisync(&s3.endpoint);
        r.ok();
        assert_eq!(file_list(&a), before, "{r}");
    });
}

/// `aws s3api put-object` of `key` (keys ferry will not write).
fn aws_put(s3: &S3, key: &str, body: &[u8]) {
    let t = tmpdir();
    let f = write(t.path(), "body", body);
    crate::util::s3::aws(
        s3,
        &[
            "s3api",
            "put-object",
            "--bucket",
            &s3.bucket,
            "--key",
            key,
            "--body",
            f.to_str().unwrap(),
        ],
    );
}

/// Keys no path can hold are skipped (a line each), count as present, and hold their
/// directory: nothing in it or below it is deleted (here what another tool would have made of
/// them, `a/z` for `a//z`, and what else is there).
#[test]
fn keys_no_path_can_hold_keep_their_directory() {
    each_server(|s3| {
        let t = tmpdir();
        // Only such keys under the root: SRC is not empty, nothing is deleted.
        let url = s3.url("unnamed-top");
        let (_, prefix) = split_url(&url);
        aws_put(s3, &format!("{prefix}//lead"), b"lead");
        aws_put(s3, &format!("{prefix}/./dot"), b"dot");
        let dst = t.path().join("dst");
        for f in ["f1", "f2", "lead"] {
            write(&dst, f, f.as_bytes());
        }
        let before = file_list(&dst);
        let r = s3.run(&[&"sync", &url, &dst]);
        r.code_is(1);
        assert_eq!(r.error_lines().len(), 2, "a line per key: {r}");
        assert!(!r.err().contains("SRC is empty"), "{r}");
        assert_eq!(file_list(&dst), before, "{r}");

        // Such keys below: their directories keep everything, the rest is synced.
        let url = s3.url("unnamed-below");
        let (_, prefix) = split_url(&url);
        aws_put(s3, &format!("{prefix}/a//z"), b"z");
        aws_put(s3, &format!("{prefix}/k/./w"), b"w");
        aws_put(s3, &format!("{prefix}/x/../y"), b"y");
        aws_put(s3, &format!("{prefix}/ok/f"), b"f");
        let dst = t.path().join("dst2");
        for f in ["a/z", "a/other", "a/deep/er", "k/w", "x/y", "ok/gone"] {
            write(&dst, f, f.as_bytes());
        }
        let r = s3.run(&[&"sync", &url, &dst]);
        r.code_is(1);
        assert_eq!(r.error_lines().len(), 3, "a line per key: {r}");
        let mut have: Vec<String> = walk(&dst)
            .into_iter()
            .filter(|p| dst.join(p).is_file())
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        have.sort();
        assert_eq!(
            have,
            ["a/deep/er", "a/other", "a/z", "k/w", "ok/f", "x/y"],
            "held directories keep all, the rest is synced: {r}"
        );

        // bisync: `a/z` gone from B while B holds `a//z`: A's `a/z` is not deleted, the
        // directory is left alone on both sides; the rest is synced.
        let a = t.path().join("a");
        let j = t.path().join("j.db");
        write(&a, "a/z", b"z");
        write(&a, "b/f", b"f");
        let url = s3.url("unnamed-bisync");
        let (_, prefix) = split_url(&url);
        let bisync = || s3.run(&[&"bisync", &"--journal", &j, &a, &url]);
        bisync().ok();
        crate::util::s3::aws(
            s3,
            &[
                "s3api",
                "delete-object",
                "--bucket",
                &s3.bucket,
                "--key",
                &format!("{prefix}/a/z"),
            ],
        );
        aws_put(s3, &format!("{prefix}/a//z"), b"z from elsewhere");
        write(&a, "b/new", b"new");
        let r = bisync();
        r.code_is(1);
        assert_eq!(r.error_lines().len(), 1, "{r}");
        assert!(r.error_lines()[0].contains("have an empty segment"), "{r}");
        assert_eq!(std::fs::read(a.join("a/z")).unwrap(), b"z", "{r}");
        let down = t.path().join("down");
        s3.run(&[&"copy", &url, &down]).code_is(1);
        assert_eq!(std::fs::read(down.join("b/new")).unwrap(), b"new", "{r}");
    });
}

/// One rule for a URL with an empty segment in every command: refused with one line, exit 2,
/// nothing written.
#[test]
fn urls_with_an_empty_segment_are_refused() {
    each_server(|s3| {
        let t = tmpdir();
        let src = t.path().join("src");
        write(&src, "f", b"f");
        let url = s3.url("emptyseg");
        let (bucket, prefix) = split_url(&url);
        aws_put(s3, &format!("{prefix}/t5//lead"), b"lead");
        let bad = format!("s3://{bucket}/{prefix}/t5//lead");
        let up = format!("s3://{bucket}/{prefix}/up//x");
        let dst = t.path().join("dst");
        let j = t.path().join("j.db");
        let f = src.join("f");
        let runs: Vec<(Vec<&dyn AsRef<std::ffi::OsStr>>, &str)> = vec![
            (vec![&"ls", &bad], &bad),
            (vec![&"copy", &bad, &dst], &bad),
            (vec![&"copy", &f, &up], &up),
            (vec![&"copy", &src, &up], &up),
            (vec![&"sync", &bad, &dst], &bad),
            (vec![&"sync", &src, &up], &up),
            (vec![&"bisync", &"--journal", &j, &src, &up], &up),
        ];
        for (args, u) in runs {
            let r = s3.run(&args);
            r.code_is(2);
            let lines = r.error_lines();
            assert_eq!(lines.len(), 1, "{r}");
            assert!(
                lines[0].contains(&format!("{u}: a key with an empty segment")),
                "{r}"
            );
        }
        assert!(!dst.exists());
        // Nothing went up: the prefix holds only the key put above.
        let r = s3.run(&[&"ls", &"-r", &url]);
        assert!(!r.out().contains("up"), "{r}");
    });
}

/// A server that stops answering while an upload is sent (every connection frozen, as a
/// SIGSTOPped server: connections accepted, nothing read or answered): each attempt ends
/// after `--timeout` without a byte, the run ends with the timeout's error and exit 1.
#[test]
fn an_upload_to_a_frozen_server_ends_with_the_timeout() {
    each_server(|s3| {
        let t = tmpdir();
        let src = t.path().join("src");
        write(&src, "small", b"small file");
        // Bigger than what the sockets' buffers take: the body's writes block.
        let big: Vec<u8> = (0..(24u32 << 20)).map(|i| (i % 251) as u8).collect();
        write(&src, "big", &big);
        for name in ["small", "big"] {
            let p = Proxy::start(&s3.endpoint, |ex| {
                // Single PUTs and parts (the multipart upload's POST goes through).
                if ex.method == "PUT" {
                    Fault::Freeze
                } else {
                    Fault::Pass
                }
            });
            let url = s3.url("frozen");
            let r = via(
                s3,
                &p.endpoint,
                &[
                    &"copy",
                    &"--timeout",
                    &"2",
                    &src.join(name),
                    &format!("{url}/{name}"),
                ],
            );
            assert!(p.faults() > 0, "{r}");
            assert_eq!(r.code, Some(1), "{name}: {r}");
            // The stall is said as it happens, and the error names the timeout.
            let ep = &p.endpoint;
            let err = r.err();
            assert!(
                err.contains(&format!("ferry: s3 {ep}: no answer for 2 s (retrying)")),
                "{name}: {r}"
            );
            assert!(
                err.lines().any(|l| !l.contains("(retrying)")
                    && (l.contains(&format!("no answer from {ep} for 2 s"))
                        || l.contains(&format!("{ep} unreachable: no answer for 2 s")))),
                "{name}: the timeout's error: {r}"
            );
            assert!(!r.out().contains("copy"), "{r}");
        }
    });
}
