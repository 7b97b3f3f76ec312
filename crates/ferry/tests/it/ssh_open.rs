//! What a run over ssh asks `ferry serve` before its walk, read off the
//! wire: an `-e` command in front of the server's ssh logs what the client
//! sends (`tee`), and the log is decoded with ferry's own protocol.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::util::ssh::{ferry_ssh, holding_rsh, ssh_at as at, ssh_server as server, Hold, PY_OUT};
use crate::util::*;
use ferry_ssh::proto::{self, Req};

/// The test server's `-e` and host, or `None` with the test skipped.
fn need_server() -> Option<(String, String)> {
    server().map_err(|why| crate::util::skip(&why)).ok()
}

/// An `-e` command that runs `rsh` with what the client writes to it
/// appended to `log`, and makes `log.done` once all of it is there (after
/// the session's end, which a run need not wait for: [`requests`] does).
fn logging_rsh(dir: &Path, rsh: &str, log: &Path) -> String {
    let script = dir.join("rsh-log");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ntee -a '{0}' | {rsh} \"$@\"\ns=$?\ntouch '{0}.done'\nexit $s\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.to_str().unwrap().to_string()
}

/// The kinds of requests in `log` (one connection's: its hello, then its
/// frames), in order: `Root`, `StatPath`, ...
fn requests(log: &Path) -> Vec<String> {
    let done = std::path::PathBuf::from(format!("{}.done", log.display()));
    wait_until("the wrapper did not end its log", 1200, || done.exists());
    let bytes = std::fs::read(log).unwrap();
    let mut r = &bytes[..];
    match proto::read_hello(&mut r).unwrap() {
        proto::Hello::Ferry { .. } => {}
        proto::Hello::Other(b) => panic!("not a hello: {b:?}"),
    }
    let mut out = Vec::new();
    while let Some((_, body)) = proto::read_frame(&mut r).unwrap() {
        let req: Req = proto::decode(&body).unwrap();
        let name = format!("{req:?}");
        out.push(name[..name.find([' ', '{']).unwrap_or(name.len())].to_string());
    }
    out
}

/// The tree a run walks there is stat'ed, opened and listed in the
/// connection's first write, with the hello, and so are its directories
/// that the tree here has (listed while ssh connects): their answers come
/// in the round trip that brings the server's hello, not in rounds of
/// their own after it. Checked on the wire: the server's bytes are held
/// while the client writes, and what it wrote before reading any holds
/// the walked tree's `StatRoot` and `List`, then an `OpenDirAhead` and a
/// `List` for each directory (a, a/b, a/b/c: chained, all levels), none
/// for the one the run excludes (before: the hello, `Info` and
/// `ListAhead`; `StatRoot` went once `Info` was answered, the levels once
/// the root's listing was read). Push and pull, the trees equal after.
#[test]
fn the_walked_tree_is_asked_for_in_the_first_write() {
    let Some((rsh, host)) = need_server() else {
        return;
    };
    let t = tmpdir();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("a/b/c")).unwrap();
    std::fs::create_dir_all(src.join("x/y")).unwrap();
    std::fs::write(src.join("a/b/c/f"), b"data").unwrap();
    std::fs::write(src.join("x/y/f"), b"left out").unwrap();
    let there = t.path().join("there");
    let back = t.path().join("back");
    // The first copies (and the install there) as usual.
    let ex = || ["--exclude".into(), "/x/".into()];
    let args = |s: std::ffi::OsString, d: std::ffi::OsString| {
        let mut v: Vec<std::ffi::OsString> = ex().to_vec();
        v.extend([s, d]);
        v
    };
    ferry_ssh(&rsh, "copy", &args(src.clone().into(), at(&host, &there))).ok();
    ferry_ssh(&rsh, "copy", &args(at(&host, &there), back.clone().into())).ok();
    std::fs::write(src.join("a/g"), b"more").unwrap();
    for (what, push) in [("push", true), ("pull", false)] {
        let log = t.path().join(format!("first-{what}"));
        let e = holding_rsh(t.path(), &rsh, &log, Hold::Server);
        let (s, d) = if push {
            (src.clone().into_os_string(), at(&host, &there))
        } else {
            (at(&host, &there), back.clone().into_os_string())
        };
        ferry_ssh(&e, "copy", &args(s, d)).ok();
        let first = requests(&log);
        let at_ = |k: &str| first.iter().position(|a| a == k);
        let count = |k: &str| first.iter().filter(|a| *a == k).count();
        assert!(at_("Info").is_some(), "{what}: {first:?}");
        let (Some(ahead), Some(stat), Some(list)) =
            (at_("ListAhead"), at_("StatRoot"), at_("List"))
        else {
            panic!("{what}: the first write holds no StatRoot and List: {first:?}");
        };
        assert!(ahead < stat && stat < list, "{what}: {first:?}");
        assert_eq!(count("OpenDirAhead"), 3, "{what}: a, a/b, a/b/c: {first:?}");
        assert_eq!(count("List"), 4, "{what}: the root and 3 more: {first:?}");
    }
    assert_trees_equal(&src.join("a"), &there.join("a"));
    assert_trees_equal(&src.join("a"), &back.join("a"));
    assert!(!there.join("x").exists() && !back.join("x").exists());
}

/// A no-op push into an existing directory and a pull of a remote tree:
/// what SRC or DST there is and the opening of its tree are one request
/// (`StatRoot`), with no `StatPath` and no `Root` of their own.
#[test]
fn resolving_a_remote_tree_and_opening_it_is_one_request() {
    let Some((rsh, host)) = need_server() else {
        return;
    };
    let t = tmpdir();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"data").unwrap();
    let there = t.path().join("there");
    std::fs::create_dir(&there).unwrap();

    for (what, push) in [("push", true), ("pull", false)] {
        let log = t.path().join(format!("log-{what}"));
        let e = logging_rsh(t.path(), &rsh, &log);
        let back = t.path().join("back");
        let (s, d) = if push {
            (src.clone().into_os_string(), at(&host, &there))
        } else {
            (at(&host, &there), back.clone().into_os_string())
        };
        ferry_ssh(&e, "copy", &[s, d]).ok();
        let asked = requests(&log);
        let count = |k: &str| asked.iter().filter(|a| *a == k).count();
        assert_eq!(count("StatRoot"), 1, "{what}: {asked:?}");
        assert_eq!(count("Root"), 0, "{what}: {asked:?}");
        assert_eq!(count("StatPath"), 0, "{what}: {asked:?}");
        let copy = if push { &there } else { &back };
        assert_eq!(std::fs::read(copy.join("d/f")).unwrap(), b"data", "{what}");
    }
}

thread_local! {
    /// Whether the last [`started`]'s first start was `ssh -G`.
    static LAST_FIRST: std::cell::RefCell<bool> = const { std::cell::RefCell::new(false) };
}

/// The ssh started by the runs of [`a_first_connection_starts_with_the_last_cipher_answer`],
/// from its log: `ssh -G` questions apart, each connection's options.
fn started(log: &Path) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let _ = std::fs::remove_file(log);
    let asked = text.lines().filter(|l| l.contains(" -G ")).count();
    // With a kept answer the connection's ssh is started before `ssh -G`
    // (a start holds ferry's thread a millisecond or more); without one,
    // `ssh -G` first, as its answer is waited for. Which was started first
    // by the process ids the `-e` command logs (given out in order), not by
    // the order of the lines: each start's shell writes its own. Ids wrap
    // at `kernel.pid_max` (32,768 here, and the suite's processes and
    // threads go round it several times a run): the first is the one every
    // other follows by less than half the circle.
    let max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|m| m.trim().parse::<u64>().ok())
        .unwrap_or(1 << 22);
    let starts: Vec<(u64, &str)> = text
        .lines()
        .filter_map(|l| Some((l.split_once(' ')?.0.parse::<u64>().ok()?, l)))
        .collect();
    let first = starts
        .iter()
        .find(|(a, _)| starts.iter().all(|(b, _)| (b + max - a) % max < max / 2))
        .map(|(_, l)| l.contains(" -G "));
    LAST_FIRST.with(|f| *f.borrow_mut() = first.unwrap_or(false));
    let conns = text
        .lines()
        .filter(|l| !l.contains(" -G "))
        .map(str::to_string)
        .collect();
    (asked, conns)
}

/// `ssh -G` (whether the configuration chooses a cipher order) does not hold
/// up the start: a run's first connection starts with the last run's answer,
/// kept in `$XDG_CACHE_HOME/ferry/ssh-ciphers`, while `ssh -G` runs beside it.
/// When the configuration has changed since, that connection is given up
/// before it is used and one with the user's choice carries the run; the
/// next run starts right at once. Default flags (the shipped ferry there).
#[test]
fn a_first_connection_starts_with_the_last_cipher_answer() {
    let Some((rsh, host)) = need_server() else {
        return;
    };
    let t = tmpdir();
    // An -e command named ssh (so ferry asks `ssh -G`) that logs each start;
    // its `ssh -G` answers a second late while the file `hold` is there.
    let cfg = t.path().join("ssh_config");
    let given = rsh
        .split_whitespace()
        .skip_while(|w| *w != "-F")
        .nth(1)
        .unwrap();
    std::fs::copy(given, &cfg).unwrap();
    let log = t.path().join("log");
    let hold = t.path().join("hold");
    let wrap = t.path().join("bin");
    std::fs::create_dir(&wrap).unwrap();
    std::fs::write(
        wrap.join("ssh"),
        format!(
            "#!/bin/sh\necho \"$$ $*\" >> '{}'\ncase \" $* \" in *\" -G \"*) [ -e '{}' ] && sleep 1;; esac\nexec ssh \"$@\"\n",
            log.display(),
            hold.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(wrap.join("ssh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = format!("{} -F {}", wrap.join("ssh").display(), cfg.display());
    let cache = t.path().join("cache");
    let src = t.path().join("src");
    let there = t.path().join("there");
    let run = |n: usize| {
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join(format!("f{n}")), format!("run {n}")).unwrap();
        let mut c = std::process::Command::new(bin());
        c.args(["copy", "-e", &e])
            .arg(&src)
            .arg(at(&host, &there))
            .env("XDG_CACHE_HOME", &cache)
            .stdin(std::process::Stdio::null());
        run_within(c, std::time::Duration::from_secs(600)).ok();
        assert_eq!(
            std::fs::read(there.join(format!("f{n}"))).unwrap(),
            format!("run {n}").as_bytes()
        );
        started(&log)
    };
    let kept = || std::fs::read_to_string(cache.join("ferry/ssh-ciphers")).unwrap();
    let gcm = "Ciphers=aes128-gcm@openssh.com,";
    // Nothing kept: asked first, then every connection with AES-GCM first
    // (ssh is left to its defaults); the answer kept.
    let (asked, conns) = run(1);
    assert_eq!(asked, 1);
    assert!(
        LAST_FIRST.with(|f| *f.borrow()),
        "ssh -G first when nothing is kept"
    );
    if conns.iter().all(|c| !c.contains("Ciphers=")) {
        // (No AES instructions here: ferry leaves ssh's order as it is.)
        return;
    }
    assert!(conns.iter().all(|c| c.contains(gcm)), "{conns:?}");
    assert!(kept().trim_end().ends_with(" gcm"), "{}", kept());
    // The next run: one connection, with the kept answer, which is right.
    let (asked, conns) = run(2);
    assert_eq!((asked, conns.len()), (1, 1), "{conns:?}");
    assert!(conns[0].contains(gcm), "{conns:?}");
    assert!(
        !LAST_FIRST.with(|f| *f.borrow()),
        "the connection before ssh -G"
    );
    // The user now chooses a cipher: the connection started with the kept
    // answer is given up, the run goes over one with the user's choice.
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("Host *\n  Ciphers aes256-ctr\n");
    std::fs::write(&cfg, text).unwrap();
    // (`ssh -G` held back a second: ferry takes an answer that is already
    // in rather than the kept one, and a connection given up at once could
    // be killed before its `-e` command logs it.)
    std::fs::write(&hold, b"").unwrap();
    let (asked, conns) = run(3);
    std::fs::remove_file(&hold).unwrap();
    assert_eq!((asked, conns.len()), (1, 2), "{conns:?}");
    assert!(conns[0].contains(gcm), "{conns:?}");
    assert!(!conns[1].contains("Ciphers="), "{conns:?}");
    assert!(kept().trim_end().ends_with(" -"), "{}", kept());
    // And the run after it starts right at once.
    let (asked, conns) = run(4);
    assert_eq!((asked, conns.len()), (1, 1), "{conns:?}");
    assert!(!conns[0].contains("Ciphers="), "{conns:?}");
}

/// An `-e` command in front of `rsh` that passes what the client sends at once, and
/// holds what the server answers from the client's first opening of a directory
/// (`OpenDir`, `OpenDirAhead`) on, until the client has sent `want` of them (or, so that a client that waits for those answers does not
/// hang here, 20 s have passed); it writes which of the two released them to `result`
/// ("count" or "deadline"), then, at the end, how many it sent in all. The server's first answers (its hello) are held 1 s, so
/// that the tree here is listed (`Prefetch`) before the session starts, whatever the
/// machine's load.
fn gating_rsh(dir: &Path, rsh: &str, want: usize, result: &Path) -> String {
    let mut hello = Vec::new();
    proto::write_hello(&mut hello).unwrap();
    let variant = |r: &Req| proto::frame(0, r)[12];
    let opens = [
        variant(&Req::OpenDir {
            dir: 0,
            name: b"",
            new: 0,
        }),
        variant(&Req::OpenDirAhead {
            dir: 0,
            name: b"",
            new: 0,
        }),
    ];
    let words: Vec<String> = rsh.split_whitespace().map(|w| format!("{w:?}")).collect();
    let script = dir.join("rsh-gate");
    std::fs::write(
        &script,
        format!(
            r#"#!/usr/bin/env python3
import os, select, subprocess, sys, time
{PY_OUT}
HELLO, OPENS, WANT, RESULT = {hello}, {opens:?}, {want}, {result:?}
p = subprocess.Popen([{words}] + sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
up, down = p.stdin.fileno(), p.stdout.fileno()
sent, opens, held, since, released, early = b"", 0, [], None, False, []
def release(why):
    global released, early
    released = True
    with open(RESULT, "w") as f:
        f.write(why)
    for b in (early or []) + held:
        out(b)
    early = None
    held.clear()
fds, start = [0, down], time.time()
while down in fds:
    if since is not None and not released and time.time() - since > 20:
        release("deadline")
    if early is not None and time.time() - start > 1:
        for b in early:
            out(b)
        early = None
    r, _, _ = select.select(fds, [], [], 0.1)
    if 0 in r:
        b = os.read(0, 1 << 16)
        if not b:
            fds.remove(0)
            p.stdin.close()
        else:
            os.write(up, b)
            sent += b
            while len(sent) >= HELLO:
                if HELLO and len(sent) >= HELLO:
                    sent, HELLO = sent[HELLO:], 0
                    continue
                if len(sent) < 13:
                    break
                n = int.from_bytes(sent[:4], "little") + 4
                if len(sent) < n:
                    break
                if sent[12] in OPENS:
                    opens += 1
                    if since is None:
                        since = time.time()
                sent = sent[n:]
            if not released and opens >= WANT:
                release("count")
    if down in r:
        b = os.read(down, 1 << 16)
        if not b:
            fds.remove(down)
        elif early is not None:
            early.append(b)
        elif since is not None and not released:
            held.append(b)
        else:
            out(b)
if not released:
    release("end")
with open(RESULT, "a") as f:
    f.write(" %d" % opens)
sys.exit(p.wait())
"#,
            hello = hello.len(),
            result = result.display().to_string(),
            words = words.join(", "),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.to_str().unwrap().to_string()
}

/// What the gate of [`gating_rsh`] says, once it has said all: why it let go, then the
/// opens it saw, which it writes once its ssh has ended, and a run need not wait for that
/// (`conn::close_all`: a run whose changes were all confirmed returns without its
/// session's end).
fn gate_record(result: &Path) -> String {
    let record = || std::fs::read_to_string(result).unwrap_or_default();
    wait_until("the gate did not record its count", 1200, || {
        record().contains(' ')
    });
    record()
}

/// A tree over ssh is walked in one round trip, not one per level: before the walk, the
/// tree listed here while ssh connected names the directories the other side likely has,
/// and the client sends all their opens and listings at once, each chained to its
/// parent's (`PipelineStore::expect_dirs`). Checked by cause, not by time: the server's
/// answers are held from the client's first `OpenDir` until it has sent one for every
/// directory of a six-level tree; a client that waited for a level's listings before
/// opening the next would stall there (and the gate would let go after 20 s: "deadline").
/// Push (DST there) and pull (SRC there), no-op and with a change; the trees stay equal;
/// a directory the runs exclude is not opened, ahead or after.
#[test]
fn a_remote_tree_is_opened_and_listed_level_by_level_in_one_round_trip() {
    let Some((rsh, host)) = need_server() else {
        return;
    };
    let t = tmpdir();
    let src = t.path().join("src");
    let mut dirs = 0;
    for top in ["a", "b"] {
        let mut p = src.join(top);
        for depth in 0..6 {
            std::fs::create_dir_all(&p).unwrap();
            dirs += 1;
            std::fs::write(p.join("f"), format!("{top}{depth}")).unwrap();
            p = p.join(format!("l{depth}"));
        }
    }
    std::fs::write(src.join("top"), b"top").unwrap();
    // Left out by the runs below (`--exclude /x/`): opened by nobody.
    std::fs::create_dir_all(src.join("x/y/z")).unwrap();
    std::fs::write(src.join("x/y/z/f"), b"x").unwrap();
    let there = t.path().join("there");
    let back = t.path().join("back");
    // The first copies (and the install there) as usual.
    ferry_ssh(
        &rsh,
        "copy",
        &[src.clone().into_os_string(), at(&host, &there)],
    )
    .ok();
    ferry_ssh(
        &rsh,
        "copy",
        &[at(&host, &there), back.clone().into_os_string()],
    )
    .ok();
    assert_trees_equal(&src, &back);
    for (round, change) in [(0, false), (1, true)] {
        if change {
            std::fs::write(src.join("a/l0/l1/l2/f"), b"changed").unwrap();
            std::fs::write(src.join("b/l0/new"), b"new").unwrap();
        }
        for (what, push) in [("push", true), ("pull", false)] {
            let result = t.path().join(format!("gate-{what}-{round}"));
            let e = gating_rsh(t.path(), &rsh, dirs, &result);
            let (s, d) = if push {
                (src.clone().into_os_string(), at(&host, &there))
            } else {
                (at(&host, &there), back.clone().into_os_string())
            };
            let r = ferry_ssh(&e, "sync", &["--exclude".into(), "/x/".into(), s, d]);
            r.ok();
            // Released by the count, and no directory opened twice: the walk took
            // every one opened ahead (each the directory its parent's listing names).
            let why = gate_record(&result);
            assert_eq!(why, format!("count {dirs}"), "{what}, round {round}: {r}");
        }
        assert_trees_equal(&src, &there);
        assert_trees_equal(&src, &back);
    }
}

/// The directories opened ahead of the walk are a guess from the tree here; where the
/// other side differs, the guess is dropped and the walk goes its usual way, with the
/// usual result. There, where SRC has a directory: a symbolic link to a directory outside
/// the run (never followed: nothing outside changes), a file, nothing, a directory the
/// run excludes (left as it is); and a server short of descriptors (`ulimit -n 256`: it
/// opens ahead only while it holds fewer than a quarter of them, so the walk's own opens
/// of the 300 directories all succeed; without that, 256 opened ahead left it none).
/// Push and pull.
#[test]
fn directories_opened_ahead_that_are_not_there_as_guessed_change_nothing() {
    let Some((rsh, host)) = need_server() else {
        return;
    };
    let t = tmpdir();
    let src = t.path().join("src");
    let there = t.path().join("there");
    let outside = t.path().join("outside");
    for d in ["link", "file", "none", "skip"] {
        write(&src, format!("{d}/in/f"), d.as_bytes());
    }
    for i in 0..300 {
        write(&src, format!("many/d{i}/f"), b"x");
    }
    write(&outside, "in/f", b"outside");
    write(&outside, "keep", b"outside");
    let lowered = t.path().join("rsh-ulimit");
    std::fs::write(
        &lowered,
        format!("#!/bin/bash\nlast=\"${{@: -1}}\"\nset -- \"${{@:1:$#-1}}\"\nexec {rsh} \"$@\" \"ulimit -n 256; $last\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&lowered, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lowered = lowered.to_str().unwrap().to_string();
    // What DST holds after a push: SRC without the excluded directory.
    let expect = t.path().join("expect");
    ferry(["copy".as_ref(), src.as_os_str(), expect.as_os_str()]).ok();
    std::fs::remove_dir_all(expect.join("skip")).unwrap();
    for (what, e) in [("ssh", &rsh), ("ulimit -n 256 there", &lowered)] {
        // Push: the guess is SRC's tree, DST differs.
        let _ = std::fs::remove_dir_all(&there);
        ferry_ssh(
            &rsh,
            "copy",
            &[src.clone().into_os_string(), at(&host, &there)],
        )
        .ok();
        for d in ["link", "file", "none", "skip"] {
            std::fs::remove_dir_all(there.join(d)).unwrap();
        }
        std::os::unix::fs::symlink(&outside, there.join("link")).unwrap();
        std::fs::write(there.join("file"), b"a file").unwrap();
        write(&there, "skip/other", b"excluded, kept");
        let r = ferry_ssh(
            e,
            "sync",
            &[
                "--exclude".into(),
                "/skip/".into(),
                src.clone().into_os_string(),
                at(&host, &there),
            ],
        );
        r.ok();
        assert_eq!(
            std::fs::read(outside.join("in/f")).unwrap(),
            b"outside",
            "{what}: {r}"
        );
        assert_eq!(
            std::fs::read(outside.join("keep")).unwrap(),
            b"outside",
            "{what}: {r}"
        );
        assert!(
            !std::fs::symlink_metadata(there.join("link"))
                .unwrap()
                .is_symlink(),
            "{what}"
        );
        assert_eq!(
            std::fs::read(there.join("skip/other")).unwrap(),
            b"excluded, kept",
            "{what}"
        );
        assert!(!there.join("skip/in").exists(), "{what}: {r}");
        std::fs::remove_dir_all(there.join("skip")).unwrap();
        // (Both roots' mtimes moved with that removal.)
        set_mtime(&expect, (1_700_000_000, 0));
        set_mtime(&there, (1_700_000_000, 0));
        assert_trees_equal(&expect, &there);
        // Pull: the guess is the local DST's tree, the remote SRC differs.
        let _ = std::fs::remove_dir_all(&there);
        let back = t.path().join("back");
        let _ = std::fs::remove_dir_all(&back);
        ferry(["copy".as_ref(), src.as_os_str(), back.as_os_str()]).ok();
        ferry(["copy".as_ref(), src.as_os_str(), there.as_os_str()]).ok();
        for d in ["link", "file", "none"] {
            std::fs::remove_dir_all(there.join(d)).unwrap();
        }
        std::os::unix::fs::symlink(&outside, there.join("link")).unwrap();
        std::fs::write(there.join("file"), b"a file").unwrap();
        let r = ferry_ssh(
            e,
            "sync",
            &[at(&host, &there), back.clone().into_os_string()],
        );
        r.ok();
        assert_trees_equal(&there, &back);
        assert_eq!(
            std::fs::read(outside.join("in/f")).unwrap(),
            b"outside",
            "{what}: {r}"
        );
    }
}

/// A bisync's remote replica is walked as a copy's tree is: its root from
/// the connection's first write (`StatRoot` and `List`, no `Root` of its
/// own for the scan), and every directory the journal knows opened and
/// listed ahead (`OpenDirAhead` and `List`, all levels at once), so a
/// no-op asks no `OpenDir` (before: a `Root`, then an `OpenDir` and a
/// `List` per directory, one level after the other). Then a change deep
/// in B and one in A come through both ways, and a directory the journal
/// knows that is gone from B since is a miss there, not an error.
#[test]
fn a_bisync_replica_there_is_walked_from_the_first_write() {
    let Some((rsh, host)) = need_server() else {
        return;
    };
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    for f in ["top", "x/f", "x/y/f", "x/y/z/f", "w/f", "gone/f"] {
        write(&a, f, f.as_bytes());
    }
    let j = t.path().join("journal.sqlite");
    let bis = |e: &str| {
        let args: Vec<std::ffi::OsString> = vec![
            "--journal".into(),
            j.clone().into(),
            a.clone().into(),
            at(&host, &b),
        ];
        ferry_ssh(e, "bisync", &args)
    };
    bis(&rsh).ok();
    let log = t.path().join("log");
    let e = logging_rsh(t.path(), &rsh, &log);
    bis(&e).ok();
    let asked = requests(&log);
    let count = |k: &str| asked.iter().filter(|a| *a == k).count();
    assert_eq!(count("StatRoot"), 1, "{asked:?}");
    assert_eq!(
        count("OpenDir"),
        0,
        "the scan opened directories itself: {asked:?}"
    );
    // x, x/y, x/y/z, w and gone: the directories the journal knows.
    assert_eq!(count("OpenDirAhead"), 5, "{asked:?}");
    // The executor's own handle on the root, and nothing else.
    assert_eq!(count("Root"), 1, "{asked:?}");

    std::fs::write(b.join("x/y/z/new"), b"from b, deep").unwrap();
    std::fs::write(a.join("w/new"), b"from a").unwrap();
    std::fs::remove_dir_all(b.join("gone")).unwrap();
    let r = bis(&rsh);
    r.ok();
    assert_eq!(std::fs::read(a.join("x/y/z/new")).unwrap(), b"from b, deep");
    assert_eq!(std::fs::read(b.join("w/new")).unwrap(), b"from a");
    assert!(!a.join("gone").exists(), "{r}");
    // (bisync keeps no directory metadata: paths and contents.)
    assert_eq!(content(&a), content(&b));
}

/// A directory the journal knows, replaced on B by a symlink to a
/// directory outside B between runs: what is opened ahead for the hint is
/// never taken for it (the scan follows B's listing, which names a
/// symlink), so nothing outside B is listed as B's, written or removed;
/// the symlink comes to A as a symlink, and the outside stays as it was.
#[test]
fn a_hinted_directory_swapped_for_a_symlink_there_is_not_followed() {
    let Some((rsh, host)) = need_server() else {
        return;
    };
    let t = tmpdir();
    let (a, b, outside) = (
        t.path().join("a"),
        t.path().join("b"),
        t.path().join("outside"),
    );
    // (Enough besides x/y that removing its two files stays under the
    // deletion guard's half.)
    for f in ["x/f", "x/y/f", "x/y/z/f", "k1", "k2", "k3", "k4"] {
        write(&a, f, f.as_bytes());
    }
    std::fs::create_dir_all(outside.join("deep")).unwrap();
    std::fs::write(outside.join("secret"), b"not B's").unwrap();
    std::fs::write(outside.join("deep/f"), b"not B's either").unwrap();
    let j = t.path().join("journal.sqlite");
    let bis = || {
        let args: Vec<std::ffi::OsString> = vec![
            "--journal".into(),
            j.clone().into(),
            a.clone().into(),
            at(&host, &b),
        ];
        ferry_ssh(&rsh, "bisync", &args)
    };
    bis().ok();
    std::fs::remove_dir_all(b.join("x/y")).unwrap();
    std::os::unix::fs::symlink(&outside, b.join("x/y")).unwrap();
    let r = bis();
    r.ok();
    let ty = std::fs::symlink_metadata(a.join("x/y"))
        .unwrap()
        .file_type();
    assert!(ty.is_symlink(), "A's x/y: {ty:?}: {r}");
    assert_eq!(std::fs::read_link(a.join("x/y")).unwrap(), outside, "{r}");
    let mut there: Vec<_> = walk(&outside).into_iter().collect();
    there.sort();
    assert_eq!(
        there,
        vec![
            std::path::PathBuf::from("deep"),
            "deep/f".into(),
            "secret".into()
        ],
        "{r}"
    );
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"not B's");
    assert!(std::fs::symlink_metadata(b.join("x/y"))
        .unwrap()
        .file_type()
        .is_symlink());
}

/// `ferry ls host:tree` walks the tree as a copy does: what the location
/// is and its root's listing come from the connection's first write
/// (`ListAhead`, `StatRoot`, `List`: no `StatPath` and no `Root` after it),
/// and each directory's `List` goes with its `OpenDir`. It lists what a
/// local `ls` of the same tree lists; one file is listed as itself, and a
/// missing path is one line, exit 2.
#[test]
fn ls_there_takes_the_tree_from_the_first_write() {
    let Some((rsh, host)) = need_server() else {
        return;
    };
    let t = tmpdir();
    let tree = t.path().join("tree");
    for f in ["top", "x/f", "x/y/f", "w/f"] {
        write(&tree, f, f.as_bytes());
    }
    // The names as listed, sorted (the order of a parallel walk varies).
    let names = |out: &str, prefix: &str| -> Vec<String> {
        let mut v: Vec<String> = out
            .lines()
            .map(|l| {
                l.split_whitespace()
                    .last()
                    .unwrap()
                    .trim_start_matches(prefix)
                    .to_string()
            })
            .collect();
        v.sort();
        v
    };
    let here = ferry([std::ffi::OsStr::new("ls"), tree.as_os_str()]);
    here.ok();
    let log = t.path().join("log");
    let e = logging_rsh(t.path(), &rsh, &log);
    let there = ferry_ssh(&e, "ls", &[at(&host, &tree)]);
    there.ok();
    let prefix = format!("{}:{}/", host, tree.display());
    assert_eq!(
        names(&there.out(), &prefix),
        names(&here.out(), &format!("{}/", tree.display())),
        "{there}"
    );
    let asked = requests(&log);
    let count = |k: &str| asked.iter().filter(|a| *a == k).count();
    assert_eq!(count("StatRoot"), 1, "{asked:?}");
    assert_eq!(count("ListAhead"), 1, "{asked:?}");
    assert_eq!(count("StatPath") + count("Root"), 0, "{asked:?}");
    // x, x/y and w: each opened with its listing behind it.
    assert_eq!(count("OpenDir"), 3, "{asked:?}");
    assert_eq!(count("List"), 4, "{asked:?}");
    let one = ferry_ssh(&rsh, "ls", &[at(&host, &tree.join("x/f"))]);
    one.ok();
    assert_eq!(one.out().lines().count(), 1, "{one}");
    let gone = ferry_ssh(&rsh, "ls", &[at(&host, &tree.join("nothing"))]);
    gone.code_is(2);
    assert_eq!(gone.error_lines().len(), 1, "{gone}");
}
