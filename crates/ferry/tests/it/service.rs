//! docs/ferry-watch.service: a unit systemd takes (`systemd-analyze
//! verify`), hardened (`systemd-analyze security --offline=yes`: an
//! exposure under 4, run as a user, the file system read-only but for the
//! replica, no new privileges, a private /tmp, no restart after exit 2),
//! and whose command line ferry takes: it starts watching, serves its
//! page with the token of the credential file, and stops on SIGTERM.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::watch::Watch;
use crate::util::*;

fn unit() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ferry-watch.service");
    fs::read_to_string(p).expect("docs/ferry-watch.service")
}

/// The values of `key=` in the unit, in order.
fn values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .map(str::to_string)
        .collect()
}

/// The unit with ExecStart's ferry the one under test, written in `dir`.
fn installable(dir: &Path) -> PathBuf {
    let u = unit().replace("/usr/local/bin/ferry", &bin().to_string_lossy());
    let p = dir.join("ferry-watch.service");
    fs::write(&p, u).unwrap();
    p
}

fn analyze() -> bool {
    let there = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !there {
        eprintln!("skipped: systemd-analyze is not installed (apt-get install systemd)");
    }
    there
}

#[test]
fn the_sample_unit_verifies_and_is_hardened() {
    if !analyze() {
        return;
    }
    let t = tmpdir();
    let p = installable(t.path());
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "verify:\n{err}"
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&p)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let level: f64 = text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for ferry-watch.service: ")
                .nth(1)
        })
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no exposure level:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(level < 4.0, "exposure {level}:\n{text}");
    let u = unit();
    let one = |k: &str| values(&u, k).join(" ");
    assert_eq!(one("User"), "ferry", "runs as a user of its own");
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(
        one("ReadWritePaths"),
        "/backup/data",
        "the replica, writable"
    );
    assert_eq!(one("NoNewPrivileges"), "yes");
    assert_eq!(one("PrivateTmp"), "yes");
    assert_eq!(one("RestartPreventExitStatus"), "2");
    // The token is not on the command line.
    assert!(!one("ExecStart").contains("--status-token "), "{u}");
}

/// ExecStart as ferry takes it, as a user that is not root: the replicas
/// and the credential in a temporary directory, the port any: it
/// watches, serves the page with the token, and SIGTERM stops it with 0.
#[test]
fn the_sample_units_command_line_watches_and_serves_with_the_token() {
    let u = unit();
    let exec = values(&u, "ExecStart").pop().expect("ExecStart");
    let t = tmpdir();
    let (src, dst) = (t.path().join("srv"), t.path().join("backup"));
    fs::create_dir(&src).unwrap();
    write(&src, "f", b"f");
    let creds = t.path().join("creds");
    fs::create_dir(&creds).unwrap();
    fs::write(creds.join("status-token"), "tok\n").unwrap();
    let exec = exec
        .replace("${CREDENTIALS_DIRECTORY}", creds.to_str().unwrap())
        .replace("127.0.0.1:7878", "127.0.0.1:0")
        .replace("/srv/data", src.to_str().unwrap())
        .replace("/backup/data", dst.to_str().unwrap());
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/ferry"));
    // As a user of its own (nobody here) who owns DST and the token,
    // when the tests run as root.
    let mut cmd = if is_root() {
        let chown = |p: &Path| {
            let ok = Command::new("chown")
                .arg("nobody:nogroup")
                .arg(p)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown {}", p.display());
        };
        chmod(t.path(), 0o755);
        fs::create_dir(&dst).unwrap();
        chown(&dst);
        chown(&creds);
        chown(&creds.join("status-token"));
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(bin());
        c
    } else {
        Command::new(bin())
    };
    cmd.args(words);
    let mut w = Watch::spawn(cmd);
    let addr = w.status_addr();
    // (As nobody, the owners are not kept: the bytes are compared.)
    w.until("f in DST", || {
        fs::read(dst.join("f")).ok().as_deref() == Some(b"f")
    });
    let get = |auth: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}\r\n").unwrap();
        let mut r = String::new();
        let _ = s.read_to_string(&mut r);
        r
    };
    assert!(get("").starts_with("HTTP/1.1 401"));
    assert!(get("Authorization: Bearer tok\r\n").starts_with("HTTP/1.1 200"));
    w.stop_ok();
}
