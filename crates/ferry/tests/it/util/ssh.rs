//! Shared helpers of the tests against the real OpenSSH server `scripts/sshd` starts
//! (`FERRY_TEST_SSH_*`, set by `scripts/test`). The server is this machine, so a remote
//! tree is checked on disk.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use proptest::prelude::*;

use super::*;

/// (the -e command, the host alias), or why the test skips.
pub fn ssh_server() -> Result<(String, String), String> {
    let v = |k: &str| {
        std::env::var(format!("FERRY_TEST_SSH_{k}"))
            .map_err(|_| format!("FERRY_TEST_SSH_{k} is not set (scripts/test starts sshd)"))
    };
    Ok((v("RSH")?, v("HOST")?))
}

/// `host:path` of a local path.
pub fn ssh_at(host: &str, p: &Path) -> OsString {
    let mut s = OsString::from(format!("{host}:"));
    s.push(p.as_os_str());
    s
}

/// `ferry CMD` with the server's `-e`, this build as the remote ferry, then `args`.
pub fn ferry_ssh<S: AsRef<OsStr>>(rsh: &str, cmd: &str, args: &[S]) -> Run {
    let mut a: Vec<OsString> = vec![cmd.into(), "-e".into(), rsh.into()];
    a.push("--remote-ferry".into());
    a.push(bin());
    a.extend(args.iter().map(|s| s.as_ref().to_os_string()));
    ferry(&a)
}

/// A random tree for the remote backends' push and pull property tests.
#[derive(Clone, Debug)]
pub enum Gen {
    File(usize, u64, u32, Mtime),
    Link(&'static str, Mtime),
    Dir(BTreeMap<String, Gen>, u32, Mtime),
}

/// The tree `g` describes.
pub fn node(g: &Gen) -> Node {
    match g {
        Gen::File(size, seed, mode, t) => Node::File {
            data: gen_bytes(*size, *seed),
            meta: Meta::new(*mode, *t),
        },
        Gen::Link(target, t) => Node::Symlink {
            target: (*target).into(),
            meta: Meta::new(0o777, *t),
        },
        Gen::Dir(kids, mode, t) => Node::Dir {
            entries: kids.iter().map(|(n, k)| (n.into(), node(k))).collect(),
            meta: Meta::new(*mode, *t),
        },
    }
}

/// Random trees with a directory at the top: files of several sizes,
/// symlinks, names with a blank and a non-ASCII letter; mtimes with
/// nanoseconds when `nanos` (else whole seconds, for SFTP).
pub fn gen_tree(nanos: bool) -> impl Strategy<Value = Gen> {
    let t = (
        1_000_000_000i64..1_900_000_000,
        0u32..if nanos { 1_000_000_000 } else { 1 },
    );
    let size = prop_oneof![
        3 => 0usize..300,
        1 => Just(4096usize),
        1 => Just(300_000usize),
        1 => Just((2usize << 20) + 5),
    ];
    let leaf = prop_oneof![
        4 => (size, any::<u64>(), prop::sample::select(&[0o644u32, 0o600, 0o755, 0o444][..]), t.clone())
            .prop_map(|(s, seed, m, t)| Gen::File(s, seed, m, t)),
        1 => (prop::sample::select(&["a", "../x", "/nowhere", "d/e"][..]), t.clone())
            .prop_map(|(l, t)| Gen::Link(l, t)),
    ];
    let name = prop_oneof![3 => "[a-z]{1,5}", 1 => Just("sp ace\u{e9}".to_string())];
    leaf.prop_recursive(3, 40, 6, move |inner| {
        (
            prop::collection::btree_map(name.clone(), inner, 0..6),
            prop::sample::select(&[0o755u32, 0o700, 0o750][..]),
            t.clone(),
        )
            .prop_map(|(k, m, t)| Gen::Dir(k, m, t))
    })
    .prop_filter("a directory at the top", |g| matches!(g, Gen::Dir(..)))
}

/// A tree of names users get by mistake: a newline, bytes that are not
/// UTF-8, a leading dash, blanks; in a directory of such a name too.
pub fn odd_names_tree(root: &Path) -> Vec<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let names: Vec<Vec<u8>> = vec![
        b"line\nbreak".to_vec(),
        b"bad\xff\xfebytes".to_vec(),
        b"-dash".to_vec(),
        b" lead and trail ".to_vec(),
        b"dir\n\xff/inner\nname".to_vec(),
    ];
    for (i, n) in names.iter().enumerate() {
        let p = root.join(std::ffi::OsStr::from_bytes(n));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, gen_bytes(100 + i, i as u64)).unwrap();
    }
    names
}

/// Server processes stopped with SIGSTOP (a frozen server): continued
/// by [`Frozen::thaw`], killed if the test ends without it.
pub struct Frozen(pub Vec<String>);

fn signal(sig: &str, pid: &str) {
    let _ = std::process::Command::new("kill").args([sig, pid]).status();
}

impl Frozen {
    /// Stop `pids`.
    pub fn stop(pids: &str) -> Frozen {
        let pids: Vec<String> = pids.split_whitespace().map(str::to_owned).collect();
        for p in &pids {
            signal("-STOP", p);
        }
        Frozen(pids)
    }

    /// Continue them and wait until they have exited (their client is
    /// gone: they read the end of their input and leave).
    pub fn thaw(mut self) {
        for p in &self.0 {
            signal("-CONT", p);
        }
        for p in std::mem::take(&mut self.0) {
            let proc = std::path::PathBuf::from(format!("/proc/{p}"));
            let mut waited = 0;
            while proc.exists()
                && !std::fs::read_to_string(proc.join("stat")).is_ok_and(|s| s.contains(") Z "))
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
                waited += 1;
                assert!(waited < 600, "server {p} still runs 30 s after SIGCONT");
            }
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for p in &self.0 {
            signal("-KILL", p);
        }
    }
}

/// A script running this ferry as a remote end that dies (is killed)
/// once it has written `die_after` bytes of an in-place patch or append
/// (the kill hook of the tests' builds; patches in place from 1 MiB up).
pub fn dying_ferry(dir: &Path, die_after: u64) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dying = dir.join("dying-ferry");
    std::fs::write(
        &dying,
        format!(
            "#!/bin/sh\nFERRY_TEST_APPEND_MIN={} FERRY_TEST_APPEND_DIE={die_after} exec '{}' \"$@\"\n",
            1u64 << 20,
            bin().to_str().unwrap()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&dying, std::fs::Permissions::from_mode(0o755)).unwrap();
    dying
}

/// The bytes ferry ships to a host (this build without debug info and symbol table), as
/// its self-install puts them in the remote cache.
pub fn shipped_bin() -> Vec<u8> {
    let raw = std::fs::read(bin()).unwrap();
    ferry_ssh::install::strip(&raw).unwrap_or(raw)
}

/// The Python of the `-e` wrappers below: `out(b)` passes the server's bytes on to the
/// run, which may be gone (a run need not wait for its session's end).
pub const PY_OUT: &str = "def out(b):
    try:
        os.write(1, b)
    except OSError:
        pass
";

/// Which way [`holding_rsh`] holds a session's bytes for its first 1.5 s.
pub enum Hold {
    /// What the server sends: the log has all the client sent before it read a byte
    /// (the connection's first write).
    Server,
    /// What the client sends: the log has all the server sent before any of the
    /// client's bytes reached it.
    Client,
}

/// An `-e` command that runs `rsh` (its words), holds one way's bytes for the first
/// 1.5 s, and writes to `log` what went the other way meanwhile; `log.done` is made
/// then ([`wait_until`] it).
pub fn holding_rsh(dir: &Path, rsh: &str, log: &Path, hold: Hold) -> String {
    let words: Vec<String> = rsh.split_whitespace().map(|w| format!("{w:?}")).collect();
    let script = dir.join("rsh-hold");
    std::fs::write(
        &script,
        format!(
            r#"#!/usr/bin/env python3
import os, select, subprocess, sys, time
{PY_OUT}
HOLD_CLIENT = {client}
p = subprocess.Popen([{words}] + sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
up, down = p.stdin.fileno(), p.stdout.fileno()
def up_write(b):
    if b:
        os.write(up, b)
    else:
        p.stdin.close()
held, log, start, fds = [], open({log:?}, "wb"), time.time(), [0, down]
while down in fds:
    if held is not None and time.time() - start > 1.5:
        log.close()
        open({log:?} + ".done", "w").close()
        for b in held:
            up_write(b) if HOLD_CLIENT else out(b)
        held = None
    r, _, _ = select.select(fds, [], [], 0.1)
    if 0 in r:
        b = os.read(0, 1 << 16)
        if not b:
            fds.remove(0)
        if held is not None and HOLD_CLIENT:
            held.append(b)
        else:
            if held is not None:
                log.write(b)
            up_write(b)
    if down in r:
        b = os.read(down, 1 << 16)
        if not b:
            fds.remove(down)
        elif held is not None and not HOLD_CLIENT:
            held.append(b)
        else:
            if held is not None:
                log.write(b)
            out(b)
sys.exit(p.wait())
"#,
            client = if matches!(hold, Hold::Client) { "True" } else { "False" },
            log = log.display().to_string(),
            words = words.join(", "),
        ),
    )
    .unwrap();
    chmod(&script, 0o755);
    script.to_string_lossy().into_owned()
}
