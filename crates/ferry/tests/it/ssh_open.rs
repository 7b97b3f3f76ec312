//! What a run over ssh asks `ferry serve` before its walk, read off the
//! wire: an `-e` command in front of the server's ssh logs what the client
//! sends (`tee`), and the log is decoded with ferry's own protocol.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::util::ssh::{ferry_ssh, ssh_at as at, ssh_server as server};
use crate::util::*;
use ferry_ssh::proto::{self, Req};

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
    let (rsh, host) = match server() {
        Ok(s) => s,
        Err(why) => {
            crate::util::skip(&why);
            return;
        }
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
