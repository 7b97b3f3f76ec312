//! What a run over ssh asks `ferry serve` before its walk, read off the
//! wire: an `-e` command in front of the server's ssh logs what the client
//! sends (`tee`), and the log is decoded with ferry's own protocol.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::util::ssh::{ferry_ssh, ssh_at as at, ssh_server as server};
use crate::util::*;
use ferry_ssh::proto::{self, Req};

/// The test server's `-e` and host, or `None` with the test skipped.
fn need_server() -> Option<(String, String)> {
    server().map_err(|why| crate::util::skip(&why)).ok()
}

/// An `-e` command that runs `rsh` with what the client writes to it
/// appended to `log`.
fn logging_rsh(dir: &Path, rsh: &str, log: &Path) -> String {
    let script = dir.join("rsh-log");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ntee -a '{}' | exec {rsh} \"$@\"\n",
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
