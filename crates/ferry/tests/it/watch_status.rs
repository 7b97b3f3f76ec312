//! `--watch --status`: the state at the top of the page and its reasons,
//! every figure a metric of the same value, refusals counted as errors,
//! bisync's tables, conflicts, the latency from the change, the live
//! gauges, and the server (several clients, a deadline for a request's
//! head, the Host checked, the token from a file or the environment,
//! HEAD). The page is rendered by a real browser (headless Chromium) in
//! each state; with `FERRY_SCREENSHOTS=DIR` its screenshots are saved
//! there (those of docs/).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::util::watch::{converge, Watch};
use crate::util::*;

/// A watch with a status page: the watch and the page's address.
fn start(args: &[&str], src: &Path, dst: &Path) -> (Watch, String) {
    let mut a = args.to_vec();
    a.extend(["--status", "127.0.0.1:0"]);
    let mut w = Watch::start(&a, src, dst);
    let addr = w.status_addr();
    (w, addr)
}

/// One raw request; the whole response.
fn raw(addr: &str, req: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp).into_owned()
}

/// GET `path` with `Host: addr` and `extra` headers: (status line, head, body).
fn get(addr: &str, path: &str, extra: &str) -> (String, String, String) {
    let resp = raw(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n"),
    );
    let (head, body) = resp.split_once("\r\n\r\n").expect("a head");
    (
        head.lines().next().unwrap_or("").to_string(),
        head.to_string(),
        body.to_string(),
    )
}

/// The samples of `/metrics` by name (with their labels), the format
/// checked strictly: HELP and TYPE before each family, counters `_total`.
fn metrics(addr: &str, auth: &str) -> BTreeMap<String, f64> {
    let (st, _, text) = get(addr, "/metrics", auth);
    assert!(st.contains("200"), "{st}");
    assert!(text.ends_with('\n'));
    let mut types = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut p = rest.splitn(3, ' ');
            let (kw, name, arg) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap());
            assert!(name.starts_with("ferry_watch_"), "{line}");
            match kw {
                "HELP" => assert!(!arg.is_empty()),
                "TYPE" => {
                    assert!(["counter", "gauge"].contains(&arg), "{line}");
                    assert!(types.insert(name.to_string(), arg.to_string()).is_none());
                }
                _ => panic!("{line}"),
            }
            continue;
        }
        let (key, v) = line.rsplit_once(' ').expect("name value");
        let family = key.split('{').next().unwrap();
        let kind = types
            .get(family)
            .unwrap_or_else(|| panic!("no TYPE before {line}"));
        if kind == "counter" {
            assert!(family.ends_with("_total"), "{family}");
        } else {
            assert!(!family.ends_with("_total"), "{family}");
        }
        assert!(out
            .insert(key.to_string(), v.parse::<f64>().expect(line))
            .is_none());
    }
    out
}

fn state(m: &BTreeMap<String, f64>) -> &'static str {
    ["in_sync", "syncing", "degraded", "stopped"]
        .into_iter()
        .find(|s| m[&format!("ferry_watch_state{{state=\"{s}\"}}")] == 1.0)
        .expect("one state")
}

/// Each `data-metric`/`data-value` pair of the page.
fn figures(page: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let mut rest = page;
    while let Some(i) = rest.find("data-metric=\"") {
        rest = &rest[i + 13..];
        let name = rest[..rest.find('"').unwrap()].to_string();
        let j = rest.find("data-value=\"").unwrap();
        let v = &rest[j + 12..];
        out.push((name, v[..v.find('"').unwrap()].parse().unwrap()));
    }
    out
}

/// The page and the metrics agree on every figure the page shows (asked
/// until two answers in a row are the same: the watch is idle).
fn page_matches_metrics(w: &mut Watch, addr: &str, auth: &str) -> String {
    let mut page = String::new();
    w.until_none(|| {
        let m = metrics(addr, auth);
        page = get(addr, "/", auth).2;
        let m2 = metrics(addr, auth);
        let figs = figures(&page);
        if figs.len() < 13 {
            return Some(format!("too few figures on the page:\n{page}"));
        }
        let drop_time = |m: &BTreeMap<String, f64>| {
            m.iter()
                .filter(|(k, _)| !k.contains("eta"))
                .map(|(k, v)| (k.clone(), *v))
                .collect::<Vec<_>>()
        };
        if drop_time(&m) != drop_time(&m2) {
            return Some("the watch is not idle".into());
        }
        figs.iter()
            .find(|(n, v)| m.get(n) != Some(v))
            .map(|(n, v)| format!("{n}: page {v}, metrics {:?}\n{page}", m.get(n)))
    });
    page
}

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|b| {
        Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The page as a real browser renders it (its DOM), in state `want`;
/// with `FERRY_SCREENSHOTS=DIR`, its screenshot is saved as
/// `DIR/status-NAME.png`. Skipped (said) without chromium.
fn browser(addr: &str, token: &str, want: &str, name: &str) {
    let Some(bin) = chromium() else {
        eprintln!("skipped: chromium is not installed (the page was checked over HTTP only)");
        return;
    };
    let profile = tmpdir();
    let url = format!("http://{addr}/?token={token}");
    let run = |extra: &[String]| {
        Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg(&url)
            .output()
            .expect("chromium")
    };
    // Asked again until the watch is in that state (a run its own
    // writes cause may be in flight at first).
    let end = std::time::Instant::now() + crate::util::watch::WAIT;
    loop {
        let out = run(&["--dump-dom".to_string()]);
        let dom = String::from_utf8_lossy(&out.stdout);
        if dom.contains(&format!("data-state=\"{want}\"")) && dom.contains("<svg id=\"throughput\"")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "chromium's DOM (want {want}):\n{dom}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if let Ok(dir) = std::env::var("FERRY_SCREENSHOTS") {
        let png = Path::new(&dir).join(format!("status-{name}.png"));
        let out = run(&[
            format!("--screenshot={}", png.display()),
            "--window-size=900,820".to_string(),
        ]);
        assert!(
            fs::read(&png).is_ok_and(|b| b.starts_with(b"\x89PNG")),
            "no screenshot: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_server_takes_several_clients_checks_host_and_reads_the_token_from_a_file() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    let tf = t.path().join("token");
    fs::write(&tf, "s3cret\n").unwrap();
    chmod(&tf, 0o644);
    let (mut w, addr) = start(
        &["sync", "--status-token-file", tf.to_str().unwrap()],
        &src,
        &dst,
    );
    converge(&src, &dst, &mut w);
    // A token file others can read is said.
    w.line_with("readable by other users (mode 0644)");
    // The token is not on the command line (`ps`).
    let cmdline = fs::read(format!("/proc/{}/cmdline", w.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("s3cret"));
    // A client that sends half a head and waits holds no other one.
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: ").unwrap();
    let (st, _, _) = get(&addr, "/metrics", "authorization: bearer s3cret\r\n");
    assert!(
        st.contains("200"),
        "bearer in any case, while a slow client waits: {st}"
    );
    // localhost:PORT is this server too.
    let port = addr.rsplit(':').next().unwrap();
    let r = raw(
        &addr,
        &format!("GET /metrics HTTP/1.1\r\nHost: localhost:{port}\r\nAuthorization: Bearer s3cret\r\n\r\n"),
    );
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    // Another site's name (DNS rebinding) is not.
    let r = raw(
        &addr,
        "GET /metrics HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer s3cret\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 421"), "{r}");
    let r = raw(
        &addr,
        &format!("GET /metrics HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n"),
    );
    assert!(r.starts_with("HTTP/1.1 421"), "{r}");
    // Without the token: 401, and how to give it.
    let (st, head, _) = get(&addr, "/metrics", "");
    assert!(st.contains("401"), "{st}");
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{head}"
    );
    let (st, _, _) = get(&addr, "/metrics", "Authorization: Bearer wrong\r\n");
    assert!(st.contains("401"), "{st}");
    // HEAD: the head of GET's answer, no body.
    let r = raw(
        &addr,
        &format!("HEAD / HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer s3cret\r\n\r\n"),
    );
    let (head, body) = r.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.1 200") && head.contains("Content-Length: "),
        "{r}"
    );
    assert!(body.is_empty(), "{r}");
    let r = raw(
        &addr,
        &format!("GET / HTTP/1.1\r\nHost: {addr}\r\nHost: evil.example\r\nAuthorization: Bearer s3cret\r\n\r\n"),
    );
    assert!(r.starts_with("HTTP/1.1 400"), "two Hosts: {r}");
    let r = raw(
        &addr,
        &format!("POST / HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer s3cret\r\nContent-Length: 0\r\n\r\n"),
    );
    assert!(
        r.starts_with("HTTP/1.1 405") && r.contains("Allow: GET, HEAD"),
        "{r}"
    );
    // The slow client's head never comes: it is answered 408 and
    // closed, however long it keeps the connection.
    slow.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut resp = String::new();
    let _ = slow.read_to_string(&mut resp);
    assert!(resp.starts_with("HTTP/1.1 408"), "{resp:?}");
    w.stop_ok();
}

#[test]
fn the_token_may_come_from_the_environment() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["sync", "--watch", "--status", "127.0.0.1:0"])
        .arg(&src)
        .arg(&dst)
        .env("FERRY_STATUS_TOKEN", "fromenv");
    let mut w = Watch::spawn(cmd);
    let addr = w.status_addr();
    assert!(get(&addr, "/", "").0.contains("401"));
    assert!(get(&addr, "/?token=fromenv", "").0.contains("200"));
    w.stop_ok();
    // An empty token file is refused.
    let tf = t.path().join("empty");
    fs::write(&tf, "\n").unwrap();
    let r = ferry([
        "sync",
        "--watch",
        "--status",
        "127.0.0.1:0",
        "--status-token-file",
        tf.to_str().unwrap(),
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
    ]);
    r.code_is(2);
    assert!(r.err().contains("the token is empty"), "{r}");
}

/// A run refused (SRC emptied: its files removed while DST has them)
/// counts as an error on the page and in the metrics, and the state says
/// degraded and why; a run that succeeds afterwards makes it in sync.
#[test]
fn a_refused_run_is_an_error_and_the_watch_is_degraded_until_a_run_succeeds() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    write(&src, "f", b"f");
    fs::create_dir(src.join("d")).unwrap();
    let (mut w, addr) = start(&["sync", "--status-token", "tk"], &src, &dst);
    converge(&src, &dst, &mut w);
    let auth = "Authorization: Bearer tk\r\n";
    w.until("in sync, 2 directories watched", || {
        let m = metrics(&addr, auth);
        state(&m) == "in_sync" && m["ferry_watch_watched_directories"] == 2.0
    });
    let page = page_matches_metrics(&mut w, &addr, auth);
    assert!(page.contains("data-state=\"in_sync\""), "{page}");
    browser(&addr, "tk", "in_sync", "in-sync");
    // The watched directories follow the tree.
    fs::create_dir_all(src.join("d/e/g")).unwrap();
    w.until("4 directories watched", || {
        metrics(&addr, auth)["ferry_watch_watched_directories"] == 4.0
    });
    fs::remove_dir_all(src.join("d")).unwrap();
    fs::remove_file(src.join("f")).unwrap();
    w.line_with("SRC is empty");
    w.until("the refusal counted", || {
        let m = metrics(&addr, auth);
        m["ferry_watch_refused_runs_total"] >= 1.0 && m["ferry_watch_errors_total"] >= 1.0
    });
    w.until("degraded, 1 directory watched", || {
        let m = metrics(&addr, auth);
        state(&m) == "degraded" && m["ferry_watch_watched_directories"] == 1.0
    });
    let page = page_matches_metrics(&mut w, &addr, auth);
    assert!(page.contains("data-state=\"degraded\""), "{page}");
    assert!(page.contains("SRC is empty"), "{page}");
    browser(&addr, "tk", "degraded", "degraded");
    write(&src, "g", b"g");
    converge(&src, &dst, &mut w);
    w.until("in sync again", || {
        state(&metrics(&addr, auth)) == "in_sync"
    });
    w.stop_ok();
}

/// The latency counts from the change, not from when ferry read it:
/// ferry stopped (SIGSTOP) 3 s while a file is written shows at least 3 s.
#[test]
fn the_latency_counts_from_the_change_not_from_when_ferry_read_it() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    let (mut w, addr) = start(&["sync"], &src, &dst);
    converge(&src, &dst, &mut w);
    w.until("a first run", || {
        metrics(&addr, "")["ferry_watch_runs_total"] >= 1.0
    });
    w.signal("STOP");
    // Stopped (every thread in state T, /proc/PID/task/*/stat) before the write.
    let tasks = format!("/proc/{}/task", w.child.id());
    w.until("ferry stopped", || {
        fs::read_dir(&tasks).is_ok_and(|ts| {
            ts.flatten().all(|t| {
                fs::read_to_string(t.path().join("stat"))
                    .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('T')))
            })
        })
    });
    write(&src, "f", b"written while ferry was stopped");
    // The stop itself is what is measured (not a wait for something).
    std::thread::sleep(Duration::from_secs(3));
    w.signal("CONT");
    converge(&src, &dst, &mut w);
    // The run that copied f ended (its latency is the last one).
    w.until("the run of f ended", || {
        let m = metrics(&addr, "");
        m["ferry_watch_transferred_files_total"] >= 1.0
            && m["ferry_watch_runs_total"] >= 2.0
            && m["ferry_watch_running"] == 0.0
    });
    let m = metrics(&addr, "");
    assert!(m["ferry_watch_last_change_latency_seconds"] >= 3.0, "{m:?}");
    w.stop_ok();
}

/// While a run is in flight (slowed by --bwlimit), the page says syncing
/// with the bytes left, and the changes that come meanwhile are in the
/// queue.
#[test]
fn a_run_in_flight_shows_its_progress_and_the_queue_grows_meanwhile() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    let (mut w, addr) = start(
        &["sync", "--bwlimit", "256K", "--status-token", "tk"],
        &src,
        &dst,
    );
    converge(&src, &dst, &mut w);
    let auth = "Authorization: Bearer tk\r\n";
    // Made aside and moved in: it appears whole (a file still being
    // written could be copied, then change, and end the run early).
    write(t.path(), "big", &gen_bytes(24 << 20, 3));
    fs::rename(t.path().join("big"), src.join("big")).unwrap();
    w.until("a run in flight with bytes left", || {
        let m = metrics(&addr, auth);
        m["ferry_watch_running"] == 1.0 && m["ferry_watch_run_remaining_bytes"] > 0.0
    });
    for i in 0..3 {
        write(&src, format!("n{i}"), b"n");
    }
    // (The run may end first on a very slow machine: then the queue was
    // taken by the next run, and the test says so.)
    let mut seen = false;
    w.until(
        "the queue holds the changes that came during the run",
        || {
            let m = metrics(&addr, auth);
            seen = m["ferry_watch_running"] == 1.0 && m["ferry_watch_queue_length"] >= 3.0;
            seen || m["ferry_watch_running"] == 0.0
        },
    );
    assert!(
        seen,
        "the run ended before the queue was seen (24 MiB at 256 KiB/s)"
    );
    let m = metrics(&addr, auth);
    assert_eq!(state(&m), "syncing");
    let page = get(&addr, "/", auth).2;
    assert!(page.contains("id=\"progress\""), "{page}");
    browser(&addr, "tk", "syncing", "syncing");
    w.kill();
}

/// bisync's page: its actions in Recent with their side, a conflict
/// listed (both sides changed while ferry was stopped), a path that fails
/// on B (immutable) in the errors and the failing paths, with its side.
#[test]
fn bisync_page_lists_actions_conflicts_and_failing_paths_with_their_side() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    write(&a, "f", b"a");
    let journal = t.path().join("j.sqlite");
    let (mut w, addr) = start(
        &[
            "bisync",
            "--journal",
            journal.to_str().unwrap(),
            "--status-token",
            "tk",
        ],
        &a,
        &b,
    );
    let auth = "Authorization: Bearer tk\r\n";
    w.until("f on B", || {
        fs::read(b.join("f")).ok().as_deref() == Some(b"a")
    });
    w.until("the copy counted", || {
        metrics(&addr, auth)["ferry_watch_transferred_files_total"] >= 1.0
    });
    let page = get(&addr, "/", auth).2;
    assert!(
        page.contains("<td>B</td><td>copy</td><td class=\"path\">f</td>"),
        "{page}"
    );
    // A conflict: c made on both sides, differently, while ferry is stopped.
    w.signal("STOP");
    write(&a, "c", b"from a");
    write(&b, "c", b"from b, longer");
    w.signal("CONT");
    w.until("a conflict counted", || {
        metrics(&addr, auth)["ferry_watch_conflicts_total"] >= 1.0
    });
    let page = page_matches_metrics(&mut w, &addr, auth);
    assert!(
        page.contains("id=\"conflicts\"") && page.contains("conflict"),
        "{page}"
    );
    browser(&addr, "tk", "in_sync", "conflict");
    // A path that fails on B.
    let chattr = |flag: &str| {
        Command::new("chattr")
            .arg(flag)
            .arg(b.join("f"))
            .status()
            .is_ok_and(|s| s.success())
    };
    if !chattr("+i") {
        eprintln!("skipped the failing path: chattr +i does not work here");
        w.stop_ok();
        return;
    }
    fs::write(a.join("f"), b"changed on a").unwrap();
    w.until("f failing on B", || {
        let m = metrics(&addr, auth);
        m["ferry_watch_failing_paths"] >= 1.0 && m["ferry_watch_errors_total"] >= 1.0
    });
    let page = get(&addr, "/", auth).2;
    chattr("-i");
    assert!(page.contains("id=\"failing\""), "{page}");
    assert!(
        page.contains("<td>B</td><td class=\"path\">f</td>"),
        "the failing path and its side:\n{page}"
    );
    assert!(page.contains("data-state=\"degraded\""), "{page}");
    w.kill();
}

/// More clients at once than the server answers: the one too many gets a
/// 503 at once (not a wait), and once they go the server answers again.
#[test]
fn more_clients_than_the_server_takes_get_503_and_it_serves_again() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    let (mut w, addr) = start(&["sync"], &src, &dst);
    converge(&src, &dst, &mut w);
    // 32 connections that send nothing (each held until its head's
    // deadline).
    let idle: Vec<TcpStream> = (0..32)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let (st, _, body) = get(&addr, "/metrics", "");
    assert!(st.contains("503"), "{st}\n{body}");
    drop(idle);
    w.until("answered again", || {
        get(&addr, "/metrics", "").0.contains("200")
    });
    w.stop_ok();
}

/// A root gone: degraded, the side and the root named, and in sync again
/// once it is back and synced.
#[test]
fn a_root_gone_is_degraded_and_named_until_it_is_back() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    write(&src, "f", b"f");
    let (mut w, addr) = start(&["sync"], &src, &dst);
    converge(&src, &dst, &mut w);
    let aside = t.path().join("aside");
    fs::rename(&src, &aside).unwrap();
    w.until("degraded, the root gone", || {
        let m = metrics(&addr, "");
        state(&m) == "degraded" && m["ferry_watch_roots_gone"] == 1.0
    });
    let page = page_matches_metrics(&mut w, &addr, "");
    assert!(
        page.contains(&format!("root gone: SRC {}", src.display())),
        "{page}"
    );
    fs::rename(&aside, &src).unwrap();
    write(&src, "g", b"g");
    converge(&src, &dst, &mut w);
    w.until("in sync again", || state(&metrics(&addr, "")) == "in_sync");
    w.stop_ok();
}
