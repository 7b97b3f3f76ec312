//! The SSH backend against a real OpenSSH server (`scripts/sshd`, which
//! `scripts/test` starts: `FERRY_TEST_SSH_*`), with this build of ferry as
//! the remote `ferry serve` (`--remote-ferry`): the conformance suite
//! through the Store trait, random trees pushed and pulled, bisync, ls,
//! and the one-line errors of connections that cannot start or are lost.
//! Every test skips with a line saying so when the server is not set up.
//! The remote host is this machine, so remote trees are checked on disk.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::ssh::{gen_tree, holding_rsh, node, ssh_at as at, ssh_server as server, Hold};
use crate::util::*;
use ferry_conformance::{local::read_only, Denied, Fixture, Outside};
use ferry_engine::keep::KeepBase;
use ferry_ssh::{SshStore, Target};
use proptest::prelude::*;

macro_rules! need_server {
    () => {
        match server() {
            Ok(s) => s,
            Err(why) => {
                crate::util::skip(&why);
                return;
            }
        }
    };
}

/// ferry with the test server's -e and this build as the remote ferry.
fn remote(rsh: &str, args: &[&std::ffi::OsStr]) -> Run {
    let mut a: Vec<OsString> = vec![args[0].into(), "-e".into(), rsh.into()];
    a.push("--remote-ferry".into());
    a.push(bin());
    a.extend(args[1..].iter().map(|s| s.to_os_string()));
    ferry(&a)
}

fn summary_field(r: &Run, field: &str) -> u64 {
    let line = r
        .out()
        .lines()
        .rev()
        .find(|l| l.contains("\"type\":\"summary\""))
        .unwrap_or_else(|| panic!("no summary\n{r}"))
        .to_owned();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {line}"))
}

// ------------------------------------------------------------------ conformance

struct Ssh {
    tmp: tempfile::TempDir,
    store: SshStore,
}

impl Fixture for Ssh {
    type Store = SshStore;
    fn store(&self) -> &SshStore {
        &self.store
    }
    fn denied(&self) -> Result<Denied<SshStore>, String> {
        let guard = read_only(self.tmp.path())?;
        let store = open(self.tmp.path())?;
        Ok(Denied {
            store,
            guard: Box::new(guard),
        })
    }
    fn outside(&self) -> Result<Outside<SshStore>, String> {
        let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
        Ok(Outside {
            base: KeepBase::Abs(tmp.path().as_os_str().as_bytes().to_vec()),
            store: open(tmp.path())?,
            guard: Box::new(tmp),
        })
    }
}

fn open(p: &Path) -> Result<SshStore, String> {
    let (rsh, host) = server()?;
    let set = ferry_ssh::Settings {
        rsh: Some(rsh),
        remote_ferry: Some(bin().to_string_lossy().into_owned()),
        ..Default::default()
    };
    Ok(SshStore::open(
        &Target::with(&host, None, &set)?,
        p.as_os_str().as_bytes(),
    )?)
}

fn ssh() -> Result<Ssh, String> {
    server()?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = open(tmp.path())?;
    Ok(Ssh { tmp, store })
}

ferry_conformance::suite!(conformance, ssh);

// ------------------------------------------------------------------ random trees

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    /// A random tree pushed to host:path and pulled back is equal in bytes
    /// and metadata; the second push and pull copy nothing.
    #[test]
    fn random_trees_push_and_pull(g in gen_tree(true)) {
        let Ok((rsh, host)) = server() else {
            crate::util::skip(&"FERRY_TEST_SSH_* not set");
            return Ok(());
        };
        let d = tmpdir();
        let (src, there, back) = (d.path().join("src"), d.path().join("there"), d.path().join("back"));
        materialize(&src, &node(&g));
        let there_at = at(&host, &there);
        let push: Vec<&std::ffi::OsStr> = vec!["sync".as_ref(), "--json".as_ref(), src.as_os_str(), &there_at];
        let r = remote(&rsh, &push);
        r.ok();
        assert_trees_equal(&src, &there);
        let r = remote(&rsh, &push);
        r.ok();
        prop_assert_eq!(summary_field(&r, "files_copied"), 0, "{}", r);
        let pull_from = at(&host, &there);
        let pull: Vec<&std::ffi::OsStr> = vec!["sync".as_ref(), "--json".as_ref(), &pull_from, back.as_os_str()];
        remote(&rsh, &pull).ok();
        assert_trees_equal(&src, &back);
        let r = remote(&rsh, &pull);
        r.ok();
        prop_assert_eq!(summary_field(&r, "files_copied"), 0, "{}", r);
    }
}

// ------------------------------------------------------------------ CLI

#[test]
fn ls_of_a_remote_tree_and_file() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    write(d.path(), "t/a", b"hello");
    write(d.path(), "t/sub/b", b"xy");
    let r = remote(&rsh, &["ls".as_ref(), &at(&host, &d.path().join("t"))]);
    r.ok();
    let local = ferry(["ls".as_ref(), d.path().join("t").as_os_str()]);
    local.ok();
    assert_eq!(r.out(), local.out(), "{r}");
    assert!(r.out().contains("sub/b"), "{r}");
    let r = remote(&rsh, &["ls".as_ref(), &at(&host, &d.path().join("t/a"))]);
    r.ok();
    assert!(r.out().starts_with("5 "), "{r}");
    // ssh://host:port/path: the port goes to ssh as -p.
    let port = std::env::var("FERRY_TEST_SSH_PORT").unwrap();
    let url = format!("ssh://{host}:{port}{}", d.path().join("t").display());
    let r = remote(&rsh, &["ls".as_ref(), url.as_ref()]);
    r.ok();
    assert_eq!(r.out(), local.out(), "{r}");
}

#[test]
fn one_file_to_and_from_a_remote_directory() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    write(d.path(), "f", b"one file");
    std::fs::create_dir(d.path().join("r")).unwrap();
    let f = d.path().join("f");
    remote(
        &rsh,
        &[
            "copy".as_ref(),
            f.as_os_str(),
            &at(&host, &d.path().join("r")),
        ],
    )
    .ok();
    assert_eq!(std::fs::read(d.path().join("r/f")).unwrap(), b"one file");
    let back = d.path().join("g");
    remote(
        &rsh,
        &[
            "copy".as_ref(),
            &at(&host, &d.path().join("r/f")),
            back.as_os_str(),
        ],
    )
    .ok();
    assert_eq!(std::fs::read(&back).unwrap(), b"one file");
}

/// The errors of a session that cannot start: one line each, exit 2.
#[test]
fn connections_that_cannot_start_say_why_in_one_line() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    write(d.path(), "src/a", b"a");
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    let one_line = |r: &Run, want: &str| {
        r.code_is(2);
        let lines = r.error_lines();
        assert_eq!(lines.len(), 1, "{r}");
        assert!(lines[0].contains(want), "want {want:?}\n{r}");
    };
    let missing = d.path().join("nope/deeper");
    let r = remote(
        &rsh,
        &["copy".as_ref(), &at(&host, &missing), dst.as_os_str()],
    );
    one_line(&r, "no such file or directory");
    let r = remote(
        &rsh,
        &["copy".as_ref(), src.as_os_str(), &at(&host, &missing)],
    );
    one_line(&r, "no such directory");
    for (alias, want) in [
        ("ferry-test-down", "host unreachable"),
        ("ferry-test-badauth", "authentication failed"),
        ("ferry-test-badkey", "host key verification failed"),
    ] {
        let r = remote(&rsh, &["copy".as_ref(), src.as_os_str(), &at(alias, &dst)]);
        one_line(&r, want);
    }
    // Host keys: a changed one is not an unknown one, and each line says
    // what to do.
    let r = remote(
        &rsh,
        &[
            "copy".as_ref(),
            src.as_os_str(),
            &at("ferry-test-badkey", &dst),
        ],
    );
    one_line(&r, "the host's key changed");
    assert!(r.err().contains("ssh-keygen"), "{r}");
    let unknown =
        format!("{rsh} -o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null");
    let r = remote(
        &unknown,
        &["copy".as_ref(), src.as_os_str(), &at(&host, &dst)],
    );
    one_line(&r, "known_hosts has no key for this host");
    assert!(!r.err().contains("not the one"), "{r}");
    let r = remote(
        &rsh,
        &[
            "copy".as_ref(),
            src.as_os_str(),
            &at("ferry-test-badauth", &dst),
        ],
    );
    one_line(&r, "authorized_keys");
    let r = ferry([
        "copy".as_ref(),
        "-e".as_ref(),
        rsh.as_ref(),
        "--remote-ferry".as_ref(),
        "/nonexistent/ferry".as_ref(),
        src.as_os_str(),
        &at(&host, &dst),
    ]);
    one_line(&r, "no ferry on the remote");
    assert!(r.err().contains("--remote-ferry"), "{r}");
    // A ferry speaking another protocol version.
    let other = d.path().join("other-ferry");
    std::fs::write(
        &other,
        "#!/bin/sh\nprintf 'FERRY-SERVE\\n\\347\\003\\000\\000\\0059.9.9'\ncat > /dev/null\n",
    )
    .unwrap();
    chmod(&other, 0o755);
    let r = ferry([
        "copy".as_ref(),
        "-e".as_ref(),
        rsh.as_ref(),
        "--remote-ferry".as_ref(),
        other.as_os_str(),
        src.as_os_str(),
        &at(&host, &dst),
    ]);
    one_line(&r, "is version 9.9.9 (protocol 999)");
    assert!(!dst.exists());
}

#[test]
fn bisync_between_a_local_dir_and_a_remote_one() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    write(&a, "only-a", b"from a");
    for i in 0..4 {
        write(&a, format!("keep{i}"), b"kept");
    }
    let j = d.path().join("journal.sqlite");
    let bis = |extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> =
            vec!["bisync".as_ref(), "--journal".as_ref(), j.as_os_str()];
        args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
        let rb = at(&host, &b);
        args.push(a.as_os_str());
        args.push(&rb);
        remote(&rsh, &args)
    };
    bis(&[]).ok();
    assert_eq!(content(&a), content(&b));
    write(&b, "only-b", b"from b");
    write(&a, "sub/new", b"new in a");
    std::fs::remove_file(a.join("only-a")).unwrap();
    bis(&[]).ok();
    assert_eq!(content(&a), content(&b));
    assert!(!b.join("only-a").exists() && a.join("only-b").exists());
    assert!(j.exists(), "the journal is kept locally");
}

/// How a test takes the remote `ferry serve` of a run away.
enum Gone {
    /// Killed (-9).
    Killed,
    /// Stopped (SIGSTOP): a frozen server, given up after `--timeout 3`.
    Frozen,
}

/// The remote `ferry serve` killed mid-run: exit 1 with one line about the
/// connection, nothing half-written under a final name, and a rerun
/// completes the copy.
#[test]
fn a_connection_lost_mid_run_is_one_line_and_a_rerun_completes() {
    serve_gone_mid_push(Gone::Killed);
}

/// The remote `ferry serve` frozen (SIGSTOP) in the middle of a pipelined
/// push: ferry does not wait for ever. After `--timeout` it gives up with
/// one line naming the host and the cause, exit 1, nothing half-written
/// under a final name; once the server is continued (and has left), a
/// rerun completes the copy and leaves no temporary.
#[test]
fn a_frozen_remote_serve_is_given_up_after_the_timeout_and_a_rerun_completes() {
    serve_gone_mid_push(Gone::Frozen);
}

fn serve_gone_mid_push(how: Gone) {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let src = d.path().join("src");
    for i in 0..40 {
        write(&src, format!("f{i:02}"), &gen_bytes(200_000, i));
    }
    let dst = d.path().join("dst");
    // A remote ferry that says where it runs, so the test can kill it.
    let pidf = d.path().join("serve.pid");
    let wrapper = d.path().join("ferry-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho $$ > '{}'\nexec '{}' \"$@\"\n",
            pidf.display(),
            bin().to_string_lossy()
        ),
    )
    .unwrap();
    chmod(&wrapper, 0o755);
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("copy");
    if let Gone::Frozen = how {
        cmd.args(["--timeout", "3"]);
    }
    cmd.args([
        "-e".as_ref(),
        rsh.as_ref() as &std::ffi::OsStr,
        "--remote-ferry".as_ref(),
        wrapper.as_os_str(),
        "--bwlimit".as_ref(),
        "1M".as_ref(),
        "-j".as_ref(),
        "2".as_ref(),
        src.as_os_str(),
        &at(&host, &dst),
    ])
    .stdin(std::process::Stdio::null());
    let push = std::thread::spawn(move || run_within(cmd, Duration::from_secs(120)));
    wait_until("the copy did not start", 400, || {
        pidf.exists() && dst.exists() && std::fs::read_dir(&dst).unwrap().count() >= 2
    });
    let pid = std::fs::read_to_string(&pidf).unwrap();
    let frozen = match how {
        Gone::Killed => {
            std::process::Command::new("kill")
                .args(["-9", pid.trim()])
                .status()
                .unwrap();
            None
        }
        Gone::Frozen => Some(crate::util::ssh::Frozen::stop(&pid)),
    };
    let r = push.join().unwrap();
    assert_eq!(r.code, Some(1), "{r}");
    let lines = r.error_lines();
    assert_eq!(lines.len(), 1, "{r}");
    let cause = match how {
        Gone::Killed => "connection lost".to_string(),
        Gone::Frozen => format!("{host}: connection lost: no answer from ferry serve for 3 s"),
    };
    assert!(lines[0].contains(&cause), "{r}");
    // Whatever is there under a final name is whole.
    for e in std::fs::read_dir(&dst).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if let Some(i) = name.to_str().and_then(|n| n.strip_prefix('f')) {
            let i: u64 = i.parse().unwrap();
            assert_eq!(
                std::fs::read(e.path()).unwrap(),
                gen_bytes(200_000, i),
                "{name:?}"
            );
        }
    }
    if let Some(f) = frozen {
        f.thaw();
    }
    remote(&rsh, &["copy".as_ref(), src.as_os_str(), &at(&host, &dst)]).ok();
    assert_trees_equal(&src, &dst);
    assert!(find_prefixed(&dst, b".ferry-").is_empty());
}

// ------------------------------------------------------------------ self-install

/// An -e command that runs the remote command with `env` before it (a
/// remote HOME and PATH of the test's own, so the real ones are never
/// touched): a shell script around the test server's ssh.
fn rsh_with(rsh: &str, dir: &Path, env: &str) -> String {
    let script = dir.join("rsh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nlast=\"${{@: -1}}\"\nset -- \"${{@:1:$#-1}}\"\nexec {rsh} \"$@\" \"unset XDG_CACHE_HOME; export {env}; $last\"\n"
        ),
    )
    .unwrap();
    chmod(&script, 0o755);
    script.to_string_lossy().into_owned()
}

/// A remote without ferry: this binary is installed once in the fresh
/// cache and reused next time; a cached file of that name with other
/// content is neither run nor replaced; --no-remote-install says in one
/// line what to do.
#[test]
fn self_install_once_then_reused_and_checked() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let rsh = rsh_with(
        &rsh,
        d.path(),
        &format!("HOME='{}' PATH=/usr/bin:/bin", home.display()),
    );
    write(d.path(), "src/a", b"installed");
    let src = d.path().join("src");
    let dst = at(&host, &d.path().join("dst"));
    let copy = |extra: &[&str]| {
        let mut a: Vec<OsString> = vec!["copy".into(), "-e".into(), rsh.clone().into()];
        a.extend(extra.iter().map(OsString::from));
        a.push(src.clone().into());
        a.push(dst.clone());
        ferry(&a)
    };
    let r = copy(&["--no-remote-install"]);
    r.code_is(2);
    assert_eq!(r.error_lines().len(), 1, "{r}");
    assert!(r.err().contains("no ferry on the remote"), "{r}");
    assert!(!home.join(".cache").exists(), "{r}");
    let r = copy(&[]);
    r.ok();
    assert!(r.err().contains("installed this ferry"), "{r}");
    assert_eq!(std::fs::read(d.path().join("dst/a")).unwrap(), b"installed");
    let cache = home.join(".cache/ferry");
    let names: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().ends_with(".ok"))
        .collect();
    assert_eq!(names.len(), 1, "one file, no temporaries: {names:?}");
    let cached = &names[0];
    assert_eq!(
        std::fs::read(cached).unwrap(),
        crate::util::ssh::shipped_bin()
    );
    let before = std::fs::metadata(cached).unwrap().modified().unwrap();
    // Reused: no second upload.
    write(d.path(), "src/b", b"second");
    let r = copy(&[]);
    r.ok();
    assert!(!r.err().contains("installed"), "{r}");
    assert_eq!(
        std::fs::metadata(cached).unwrap().modified().unwrap(),
        before
    );
    assert_eq!(std::fs::read(d.path().join("dst/b")).unwrap(), b"second");
    // A corrupt file of that name: not run, not replaced. (Made anew: the
    // last run's remote ferry may still be running from the old one.)
    std::fs::remove_file(cached).unwrap();
    std::fs::write(cached, b"#!/bin/sh\necho not ferry\n").unwrap();
    write(d.path(), "src/c", b"third");
    let r = copy(&[]);
    r.code_is(2);
    assert_eq!(r.error_lines().len(), 1, "{r}");
    assert!(r.err().contains("is not this ferry"), "{r}");
    assert_eq!(
        std::fs::read(cached).unwrap(),
        b"#!/bin/sh\necho not ferry\n"
    );
    assert!(!d.path().join("dst/c").exists());
}

/// ferry on the remote PATH is found and run (no installing).
#[test]
fn ferry_on_the_remote_path_is_used() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let binp = d.path().join("bin");
    std::fs::create_dir(&binp).unwrap();
    std::os::unix::fs::symlink(bin(), binp.join("ferry")).unwrap();
    let rsh = rsh_with(
        &rsh,
        d.path(),
        &format!(
            "HOME='{}' PATH='{}':/usr/bin:/bin",
            d.path().display(),
            binp.display()
        ),
    );
    write(d.path(), "src/a", b"by PATH");
    let r = ferry([
        "copy".as_ref(),
        "-e".as_ref(),
        rsh.as_ref() as &std::ffi::OsStr,
        "--no-remote-install".as_ref(),
        d.path().join("src").as_os_str(),
        &at(&host, &d.path().join("dst")),
    ]);
    r.ok();
    assert_eq!(std::fs::read(d.path().join("dst/a")).unwrap(), b"by PATH");
}

/// An -e command like [`rsh_with`]'s that also writes one line to `dir/connections` per
/// ssh it starts, and passes an SFTP subsystem request (`-s`) through as it is.
fn rsh_counted(rsh: &str, dir: &Path, env: &str) -> String {
    let script = dir.join("rsh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\necho \"$$ $*\" >> '{log}'\nfor a in \"$@\"; do [ \"$a\" = -s ] && exec {rsh} \"$@\"; done\nlast=\"${{@: -1}}\"\nset -- \"${{@:1:$#-1}}\"\nexec {rsh} \"$@\" \"unset XDG_CACHE_HOME; export {env}; $last\"\n",
            log = dir.join("connections").display(),
        ),
    )
    .unwrap();
    chmod(&script, 0o755);
    script.to_string_lossy().into_owned()
}

/// A remote home of its own under `dir` (nothing cached there yet) and the counting `-e`
/// command ([`rsh_counted`]) that gives every session that home and a plain PATH, then
/// runs `more` (shell commands, or nothing) before the command.
fn rsh_fresh_home(rsh: &str, dir: &Path, more: &str) -> (PathBuf, String) {
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    let rsh = rsh_in_home(rsh, dir, &home, more);
    (home, rsh)
}

/// [`rsh_fresh_home`]'s `-e` command (its script and log in `dir`) for a home already
/// there: sessions of both commands share it.
fn rsh_in_home(rsh: &str, dir: &Path, home: &Path, more: &str) -> String {
    let env = format!("HOME='{}' PATH=/usr/bin:/bin{more}", home.display());
    rsh_counted(rsh, dir, &env)
}

/// The ssh connections started since the last call (the log of [`rsh_counted`] emptied).
fn connections(dir: &Path) -> usize {
    let log = dir.join("connections");
    let n = std::fs::read_to_string(&log).map_or(0, |s| s.lines().count());
    let _ = std::fs::remove_file(&log);
    n
}

/// A host whose shell prints on start (a `~/.bashrc` that echoes, with and without a
/// final newline: rsync's "protocol version mismatch -- is your shell clean?"): by
/// default ferry installs itself, copies and syncs there, skipping what the shell
/// printed before its command, and says so in one note line per host and run; nothing
/// else fails.
#[test]
fn a_shell_that_prints_on_start_is_skipped_with_a_note() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (_, rsh) = rsh_fresh_home(
        &rsh,
        d.path(),
        "; echo 'Welcome to the host!'; printf 'Last login: never'",
    );
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    let sync = || {
        ferry([
            "sync".as_ref(),
            "-e".as_ref(),
            rsh.as_ref() as &std::ffi::OsStr,
            src.as_os_str(),
            &at(&host, &dst),
        ])
    };
    write(&src, "a", b"one");
    write(&src, "d/b", b"two");
    // The first run installs (its commands' output read past the shell's): two
    // start commands, one note.
    let r = sync();
    r.ok();
    assert!(r.err().contains("installed this ferry"), "{r}");
    assert_eq!(
        r.err().matches("the remote shell printed").count(),
        1,
        "{r}"
    );
    assert!(r.err().contains("Welcome to the host!"), "{r}");
    assert_trees_equal(&src, &dst);
    // Then the cached ferry: one connection, one note.
    connections(d.path());
    write(&src, "c", b"three");
    std::fs::remove_file(src.join("a")).unwrap();
    let r = sync();
    r.ok();
    assert_eq!(connections(d.path()), 1, "{r}");
    let notes = r
        .err()
        .lines()
        .filter(|l| l.contains("the remote shell printed"))
        .count();
    assert_eq!(notes, 1, "{r}");
    assert_eq!(r.error_lines().len(), notes, "{r}");
    assert_trees_equal(&src, &dst);
}

/// By default (no flags), a host with ferry costs one ssh connection, as rsync's does:
/// ferry cached there by an earlier run is run by the start command without hashing it
/// (its marker matches), and so is ferry on the remote PATH. A cached ferry whose marker
/// no longer matches (touched) is checked once by its SHA-256 and marked again. (Before:
/// three connections per run: a failing `ferry serve`, a shell hashing the cached binary,
/// then `serve`.) The first run, which installs, costs three.
#[test]
fn a_host_with_ferry_costs_one_connection() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (home, rsh) = rsh_fresh_home(&rsh, d.path(), "");
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    let copy = || {
        ferry([
            "copy".as_ref(),
            "-e".as_ref(),
            rsh.as_ref() as &std::ffi::OsStr,
            src.as_os_str(),
            &at(&host, &dst),
        ])
    };
    write(&src, "a", b"one");
    let r = copy();
    r.ok();
    assert!(r.err().contains("installed this ferry"), "{r}");
    let first = connections(d.path());
    assert!(first <= 3, "{first} connections to install: {r}");
    for i in 0..3 {
        write(&src, format!("b{i}"), b"more");
        let r = copy();
        r.ok();
        assert!(!r.err().contains("installed"), "{r}");
        assert_eq!(connections(d.path()), 1, "run {i}: {r}");
    }
    assert_trees_equal(&src, &dst);
    // Touched since (same bytes): checked once, then one connection again.
    let cache = home.join(".cache/ferry");
    let cached = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| !p.to_string_lossy().ends_with(".ok"))
        .unwrap();
    set_mtime(&cached, (1_600_000_000, 0));
    write(&src, "c", b"after a touch");
    let r = copy();
    r.ok();
    assert_eq!(connections(d.path()), 2, "{r}");
    write(&src, "d", b"marked again");
    copy().ok();
    assert_eq!(connections(d.path()), 1);
    assert_trees_equal(&src, &dst);
    // ferry on the remote PATH (no cache): one connection.
    let home2 = d.path().join("home2");
    let binp = d.path().join("bin");
    std::fs::create_dir_all(&home2).unwrap();
    std::fs::create_dir(&binp).unwrap();
    std::os::unix::fs::symlink(bin(), binp.join("ferry")).unwrap();
    let rsh2 = rsh_counted(
        &server().unwrap().0,
        d.path(),
        &format!(
            "HOME='{}' PATH='{}':/usr/bin:/bin",
            home2.display(),
            binp.display()
        ),
    );
    write(&src, "e", b"by PATH");
    let r = ferry([
        "copy".as_ref(),
        "-e".as_ref(),
        rsh2.as_ref() as &std::ffi::OsStr,
        src.as_os_str(),
        &at(&host, &dst),
    ]);
    r.ok();
    assert_eq!(connections(d.path()), 1, "{r}");
    assert!(!home2.join(".cache").exists(), "{r}");
    assert_trees_equal(&src, &dst);
}

/// A locale whose decimal separator is a comma, when this machine has one (scripts/test
/// makes de_DE.UTF-8 when it can): GNU stat writes `%.9Y` with it.
fn comma_locale() -> Option<&'static str> {
    let l = "de_DE.UTF-8";
    let out = std::process::Command::new("stat")
        .args(["-c", "%.9Y", "/"])
        .env("LC_ALL", l)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .contains(',')
        .then_some(l)
}

/// The cached ferry's marker means the same in every locale: sessions of one host that
/// come with different locales (ssh's `SendEnv LANG LC_*`, on by default on Debian and
/// Ubuntu at both ends: a user's de_DE.UTF-8, a cron job's C) each cost one connection,
/// with no second one to hash the binary again. (Before: GNU stat wrote the marker's
/// times with the session's decimal separator, so each change of locale found the
/// marker wrong: two connections and a SHA-256 of the binary, then a marker only that
/// locale matched.)
#[test]
fn a_cached_ferry_is_trusted_whatever_the_sessions_locale() {
    let (rsh, host) = need_server!();
    let Some(comma) = comma_locale() else {
        crate::util::skip(
            &"no locale with a decimal comma here (localedef -i de_DE -f UTF-8 de_DE.UTF-8)",
        );
        return;
    };
    let d = tmpdir();
    let (home, rsh_comma) = rsh_fresh_home(&rsh, d.path(), &format!(" LC_ALL={comma}"));
    let c = d.path().join("c");
    std::fs::create_dir(&c).unwrap();
    let rsh_c = rsh_in_home(&rsh, &c, &home, " LC_ALL=C");
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    let copy = |rsh: &str| {
        ferry([
            "copy".as_ref(),
            "-e".as_ref(),
            rsh.as_ref() as &std::ffi::OsStr,
            src.as_os_str(),
            &at(&host, &dst),
        ])
    };
    write(&src, "a", b"one");
    let r = copy(&rsh_comma);
    r.ok();
    assert!(r.err().contains("installed this ferry"), "{r}");
    connections(d.path());
    let marker = std::fs::read_dir(home.join(".cache/ferry"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".ok"))
        .unwrap();
    let m = std::fs::read_to_string(&marker).unwrap();
    assert!(!m.contains(','), "{m}");
    for (i, (rsh, dir)) in [
        (&rsh_c, &c),
        (&rsh_comma, &d.path().to_path_buf()),
        (&rsh_c, &c),
    ]
    .into_iter()
    .enumerate()
    {
        write(&src, format!("b{i}"), b"more");
        let r = copy(rsh);
        r.ok();
        assert!(!r.err().contains("installed"), "run {i}: {r}");
        assert_eq!(connections(dir), 1, "run {i}: {r}");
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), m, "run {i}");
    }
    assert_trees_equal(&src, &dst);
}

/// An `-e` wrapper that runs something beside ssh on the session's streams (`tee -a LOG |
/// ssh ...`, a log of what the client sends, as the tests' own): a first run on a host
/// without ferry installs it and copies without waiting. (Before: the client read the
/// start command's report to the end of its output, which the wrapper's `tee` held open
/// until the client closed its input, so the run waited for `--timeout`, 5 minutes by
/// default.)
#[test]
fn a_wrapper_beside_ssh_does_not_stall_the_first_run() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (_, counted) = rsh_fresh_home(&rsh, d.path(), "");
    let tee = d.path().join("rsh-tee");
    std::fs::write(
        &tee,
        format!(
            "#!/bin/sh\ntee -a '{}' | exec {counted} \"$@\"\n",
            d.path().join("sent").display()
        ),
    )
    .unwrap();
    chmod(&tee, 0o755);
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    write(&src, "a", b"one");
    // A stall is what is tested: the run, whose own timeout would end it only after 10
    // minutes, is given 2 minutes (it takes a few seconds) and killed past them.
    let mut run = std::process::Command::new(bin())
        .args(["copy", "--timeout", "600", "-e"])
        .args([tee.as_os_str(), src.as_os_str(), &at(&host, &dst)])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = run.kill();
            let _ = run.wait();
            panic!("the first run through the wrapper stalled (killed after 2 minutes)");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("installed this ferry"), "{err}");
    assert_trees_equal(&src, &dst);
}

/// What a server sent in `log` ([`holding_rsh`]) after its hello: each frame's id and
/// reply, decoded.
fn frames_sent(log: &Path) -> Vec<(u64, String)> {
    let done = PathBuf::from(format!("{}.done", log.display()));
    wait_until("the wrapper did not end its log", 1200, || done.exists());
    let bytes = std::fs::read(log).unwrap();
    let at = bytes
        .windows(ferry_ssh::install::START.len())
        .position(|w| w == ferry_ssh::install::START)
        .unwrap_or_else(|| panic!("no start in {bytes:?}"));
    let mut r = &bytes[at + ferry_ssh::install::START.len()..];
    assert!(matches!(
        ferry_ssh::proto::read_hello(&mut r).unwrap(),
        ferry_ssh::proto::Hello::Ferry { .. }
    ));
    let mut out = Vec::new();
    while let Ok(Some((id, body))) = ferry_ssh::proto::read_frame(&mut r) {
        let resp: ferry_ssh::proto::Resp = ferry_ssh::proto::decode(&body).unwrap();
        out.push((id, format!("{resp:?}")));
    }
    out
}

/// A host with the cached ferry is given the tree the run walks in the start command
/// (`serve --walk-ahead=PATH`), and answers the run's first flight unasked, before any
/// of the client's bytes have reached it: its `Info`, the tree's `StatRoot` and root
/// `List`, and an open and a listing of each of the root's subdirectories, announced
/// first (protocol 18: OpenSSH lets the client's input through only once the command
/// has started, a round trip too late for these). Seen by holding the client's bytes
/// for 1.5 s: what the server sent meanwhile. The run then takes them (push and pull, a
/// no-op and with a change: the trees equal), and the client's own requests for them
/// are not answered twice (the runs would fail "answered out of protocol", or take a
/// second root). A tree whose path the start command does not pass (a `!` in it) gets
/// nothing unasked: the server waits for the client's hello.
#[test]
fn the_first_flight_is_answered_before_the_clients_bytes_arrive() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (_, counted) = rsh_fresh_home(&rsh, d.path(), "");
    for (name, pushed) in [("plain", true), ("odd!name", false)] {
        let src = d.path().join(format!("src-{name}"));
        let there = d.path().join(name);
        let back = d.path().join(format!("back-{name}"));
        for sub in ["a", "b", "c/d"] {
            write(&src, format!("{sub}/f"), sub.as_bytes());
        }
        write(&src, "top", b"top");
        let run = |e: &str, s: &OsStr, t: &OsStr| {
            let args: [&OsStr; 5] = ["copy".as_ref(), "-e".as_ref(), e.as_ref(), s, t];
            ferry(args)
        };
        // The install and the first copies as usual.
        run(&counted, src.as_os_str(), &at(&host, &there)).ok();
        run(&counted, &at(&host, &there), back.as_os_str()).ok();
        for (round, change) in [(0, false), (1, true)] {
            if change {
                write(&src, "b/f", b"changed");
                write(&src, "c/new", b"new");
            }
            for (what, push) in [("push", true), ("pull", false)] {
                let log = d.path().join(format!("sent-{name}-{what}-{round}"));
                let e = holding_rsh(d.path(), &counted, &log, Hold::Client);
                let (s, t) = if push {
                    (src.clone().into_os_string(), at(&host, &there))
                } else {
                    (at(&host, &there), back.clone().into_os_string())
                };
                let r = run(&e, &s, &t);
                r.ok();
                let sent = frames_sent(&log);
                let ids: Vec<u64> = sent.iter().map(|(id, _)| *id).collect();
                if !pushed {
                    assert!(sent.is_empty(), "{name} {what} {round}: {sent:?}\n{r}");
                    continue;
                }
                let ctx = format!("{name} {what} {round}: {sent:?}\n{r}");
                assert!(sent[0].1.starts_with("Pushed(["), "{ctx}");
                for dir in ["a", "b", "c"] {
                    let named = format!("({:?},", dir.as_bytes());
                    assert!(sent[0].1.contains(&named), "{dir}: {ctx}");
                }
                assert_eq!(ids[1], u64::MAX, "Info: {ctx}");
                assert!(sent[1].1.starts_with("Info"), "{ctx}");
                assert!(
                    sent.iter().any(|(id, r)| *id == 1 && r.starts_with("Root")),
                    "{ctx}"
                );
                assert!(
                    sent.iter()
                        .any(|(id, r)| *id == 2 && r.starts_with("Listing")),
                    "{ctx}"
                );
                // Three directories: each opened and listed.
                let opened = sent
                    .iter()
                    .filter(|(_, r)| r.starts_with("DirOpened"))
                    .count();
                let listed = sent
                    .iter()
                    .filter(|(id, r)| *id > 4 && r.starts_with("Listing"))
                    .count();
                assert_eq!((opened, listed), (3, 3), "{ctx}");
            }
            assert_trees_equal(&src, &there);
            assert_trees_equal(&src, &back);
        }
    }
}

/// The end of a session costs a round trip (its input's end going there, the exit status
/// coming back), which a run waits for only when it sent a change that no reply confirms
/// (a writer's `Abort`: `conn::unconfirmed`, unit-tested). A run whose changes were all
/// confirmed returns without it: a no-op, and a copy of a small file (`Put`) and of a
/// bigger one (its data without replies, confirmed by its `Commit`). Seen through a
/// wrapper that stays 3 s after its ssh ended, then leaves a mark: a run that waits for
/// its session's end (5 s at most) returns after the mark, these before it.
#[test]
fn a_run_whose_changes_were_all_confirmed_does_not_wait_for_the_sessions_end() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    write(&src, "a", b"one");
    write(&src, "sub/b", &vec![7u8; 300 << 10]);
    remote(&rsh, &["copy".as_ref(), src.as_os_str(), &at(&host, &dst)]).ok();
    let run = |what: &str| {
        let w = d.path().join(format!("rsh-{what}"));
        let mark = d.path().join(format!("mark-{what}"));
        std::fs::write(
            &w,
            format!(
                "#!/bin/sh\n{rsh} \"$@\"\ns=$?\nsleep 3\ntouch '{}'\nexit $s\n",
                mark.display()
            ),
        )
        .unwrap();
        chmod(&w, 0o755);
        let r = remote(
            w.to_str().unwrap(),
            &["copy".as_ref(), src.as_os_str(), &at(&host, &dst)],
        );
        let waited = mark.exists();
        r.ok();
        assert!(!waited, "{what}: the run waited for its session's end\n{r}");
        r
    };
    let r = run("noop");
    assert!(r.err().contains(" 0 copied"), "{r}");
    write(&src, "a", b"one, changed");
    write(&src, "sub/b", &vec![8u8; 300 << 10]);
    let r = run("copy");
    assert!(r.err().contains(" 2 copied"), "{r}");
    assert_trees_equal(&src, &dst);
}

/// A host whose C library this ferry cannot run on (a glibc older than the one it is
/// built for, or musl: what `getconf GNU_LIBC_VERSION` or `ldd --version` say there,
/// asked in the start command's round trip) gets nothing installed. With what SFTP
/// cannot keep asked (-X), one line says why and what to do, exit 2; without, the host
/// is served over SFTP with the one note, which says why.
#[test]
fn a_host_with_an_older_glibc_or_musl_is_told_in_one_line() {
    let (rsh, host) = need_server!();
    for (libc, getconf, ldd) in [
        (
            "glibc is 2.17",
            "echo 'glibc 2.17'",
            "echo 'ldd (GNU libc) 2.17'",
        ),
        (
            "C library is musl",
            "echo 'getconf: GNU_LIBC_VERSION: unknown variable' >&2; exit 1",
            "echo 'musl libc (x86_64)' >&2; echo 'Version 1.2.4' >&2; exit 1",
        ),
    ] {
        let d = tmpdir();
        let home = d.path().join("home");
        let fake = d.path().join("fakebin");
        std::fs::create_dir(&home).unwrap();
        for (name, body) in [("getconf", getconf), ("ldd", ldd)] {
            write(&fake, name, format!("#!/bin/sh\n{body}\n").as_bytes());
            chmod(&fake.join(name), 0o755);
        }
        let rsh = rsh_counted(
            &rsh,
            d.path(),
            &format!(
                "HOME='{}' PATH='{}':/usr/bin:/bin",
                home.display(),
                fake.display()
            ),
        );
        let src = d.path().join("src");
        write(&src, "a", b"to an old host");
        let dst = d.path().join("dst");
        let copy = |flags: &[&str]| {
            let mut a: Vec<OsString> = vec!["copy".into(), "-e".into(), rsh.clone().into()];
            a.extend(flags.iter().map(OsString::from));
            a.push(src.clone().into());
            a.push(at(&host, &dst));
            ferry(&a)
        };
        let r = copy(&["-X"]);
        r.code_is(2);
        let lines = r.error_lines();
        assert_eq!(lines.len(), 1, "{r}");
        assert!(lines[0].contains(libc), "{libc}: {r}");
        assert!(
            lines[0].contains("install ferry there, or use --sftp"),
            "{r}"
        );
        assert!(!dst.exists(), "{r}");
        assert!(!home.join(".cache/ferry").exists(), "nothing uploaded: {r}");
        // One round trip told it: no install attempted.
        assert_eq!(connections(d.path()), 1, "{r}");
        let r = copy(&[]);
        r.ok();
        assert_eq!(r.err().matches("using SFTP").count(), 1, "{r}");
        assert!(r.err().contains(libc), "{r}");
        assert_eq!(std::fs::read(dst.join("a")).unwrap(), b"to an old host");
        assert!(!home.join(".cache/ferry").exists(), "nothing uploaded: {r}");
    }
}

/// `--timeout` during start-up ends the remote command too: a cached ferry whose start
/// hangs there (as on a stalled disk) is given up after the timeout (exit 2, one line),
/// and what the start command ran there is gone soon after, not left running. (Before:
/// ssh was killed here, and the remote command ran on.)
#[test]
fn a_start_given_up_by_the_timeout_leaves_nothing_running_there() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (home, rsh) = rsh_fresh_home(&rsh, d.path(), "");
    let src = d.path().join("src");
    write(&src, "a", b"a");
    let dst = d.path().join("dst");
    let copy = |timeout: &str| {
        ferry([
            "--timeout".as_ref(),
            timeout.as_ref(),
            "copy".as_ref(),
            "-e".as_ref(),
            rsh.as_ref() as &std::ffi::OsStr,
            src.as_os_str(),
            &at(&host, &dst),
        ])
    };
    copy("300").ok();
    // The cached ferry made one that hangs, its marker made to match it (as an install
    // writes it: the file's size, mtime, ctime, inode and owner, the directory's inode,
    // owner and mode).
    let cache = home.join(".cache/ferry");
    let cached = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| !p.to_string_lossy().ends_with(".ok"))
        .unwrap();
    let pidf = d.path().join("hung.pid");
    std::fs::remove_file(&cached).unwrap();
    std::fs::write(
        &cached,
        format!(
            "#!/bin/sh\necho $$ > '{}'\nexec sleep 3000\n",
            pidf.display()
        ),
    )
    .unwrap();
    chmod(&cached, 0o755);
    let key = std::process::Command::new("stat")
        .env("LC_ALL", "C")
        .args(["-c", ferry_ssh::install::MARKER_STAT])
        .arg(&cached)
        .arg(&cache)
        .output()
        .unwrap();
    let w: Vec<String> = String::from_utf8_lossy(&key.stdout)
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(w.len(), 12, "{w:?}");
    let marker = [&w[..5], &w[9..]].concat().join(" ");
    std::fs::write(
        cache.join(format!(
            "{}.ok",
            cached.file_name().unwrap().to_string_lossy()
        )),
        format!("{marker}\n"),
    )
    .unwrap();
    write(&src, "b", b"b");
    // On a loaded machine 2 s can run out before the session has even started the
    // cached script (nothing is left running then, but nothing was tested): the
    // timeout grows until the hung script has started.
    let mut r = copy("2");
    for timeout in ["5", "10", "20", ""] {
        r.code_is(2);
        assert_eq!(r.error_lines().len(), 1, "{r}");
        assert!(r.err().contains("(--timeout)"), "{r}");
        if pidf.exists() || timeout.is_empty() {
            break;
        }
        r = copy(timeout);
    }
    let pid = std::fs::read_to_string(&pidf)
        .unwrap_or_else(|e| panic!("the cached script never started ({e}): {r}"));
    let pid = pid.trim();
    let alive = || {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("3000"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while alive() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = alive();
    if left {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .status();
    }
    assert!(!left, "the hung start is still running there: {r}");
}

// ------------------------------------------------------------------ more paths

/// host:path to host:path (both through this machine), then an edit, a
/// --dry-run that changes nothing, --checksum that sees a same-size,
/// same-mtime change, and --exclude.
#[test]
fn remote_to_remote_dry_run_checksum_exclude() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    for i in 0..20 {
        write(
            &a,
            format!("d{}/f{i}", i % 3),
            &gen_bytes(1000 + i * 500, i as u64),
        );
    }
    write(&a, "skip.log", b"not copied");
    let (ra, rb) = (at(&host, &a), at(&host, &b));
    let sync = |extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = vec!["sync".as_ref(), "--json".as_ref()];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        args.push(&ra);
        args.push(&rb);
        remote(&rsh, &args)
    };
    let r = sync(&["--exclude", "*.log"]);
    r.ok();
    assert!(!b.join("skip.log").exists(), "{r}");
    std::fs::remove_file(a.join("skip.log")).unwrap();
    // Same size and mtime, other bytes: only --checksum sees it.
    let f = a.join("d1/f1");
    let t = get_mtime(&f);
    std::fs::write(&f, gen_bytes(1500, 99)).unwrap();
    set_mtime(&f, t);
    write(&a, "new", b"new file");
    let r = sync(&["--dry-run", "--checksum"]);
    r.ok();
    assert!(!b.join("new").exists(), "{r}");
    assert_ne!(std::fs::read(b.join("d1/f1")).unwrap(), gen_bytes(1500, 99));
    let r = sync(&[]);
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 1, "{r}");
    assert_ne!(std::fs::read(b.join("d1/f1")).unwrap(), gen_bytes(1500, 99));
    let r = sync(&["--checksum"]);
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 1, "{r}");
    assert_trees_equal(&a, &b);
}

/// host:path to s3:// and back, streamed through this machine (Garage:
/// FERRY_TEST_S3_*).
#[test]
fn remote_to_s3_and_back() {
    let (rsh, host) = need_server!();
    let get = |k: &str| std::env::var(k).ok();
    let (Some(ep), Some(key), Some(secret), Some(region), Some(bucket)) = (
        get("FERRY_TEST_S3_ENDPOINT"),
        get("FERRY_TEST_S3_KEY"),
        get("FERRY_TEST_S3_SECRET"),
        get("FERRY_TEST_S3_REGION"),
        get("FERRY_TEST_S3_BUCKET"),
    ) else {
        crate::util::skip(&"FERRY_TEST_S3_* are not set (scripts/test starts Garage)");
        return;
    };
    std::env::set_var("AWS_ACCESS_KEY_ID", key);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", secret);
    std::env::set_var("AWS_REGION", region);
    std::env::set_var("AWS_ENDPOINT_URL", ep);
    let d = tmpdir();
    let src = d.path().join("src");
    for i in 0..10 {
        write(&src, format!("s/f{i}"), &gen_bytes(i * 3000, i as u64));
    }
    write(&src, "big", &gen_bytes((33 << 20) + 7, 5));
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let url = format!("s3://{bucket}/ssh-{n}");
    remote(&rsh, &["copy".as_ref(), &at(&host, &src), url.as_ref()]).ok();
    let back = d.path().join("back");
    remote(&rsh, &["copy".as_ref(), url.as_ref(), &at(&host, &back)]).ok();
    assert_eq!(content(&src), content(&back));
}

/// ferry itself killed (-9) mid-run over ssh: the rerun completes and no
/// temporary is left on the remote.
/// Names with a newline, non-UTF-8 bytes, a leading dash and blanks go
/// both ways over ssh byte for byte; a second run copies nothing.
#[test]
fn odd_names_pushed_and_pulled() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (src, there, back) = (
        d.path().join("src"),
        d.path().join("there"),
        d.path().join("back"),
    );
    crate::util::ssh::odd_names_tree(&src);
    for (from, to) in [
        (src.clone().into_os_string(), at(&host, &there)),
        (at(&host, &there), back.clone().into_os_string()),
    ] {
        for copies in [5, 0] {
            let r = remote(&rsh, &["sync".as_ref(), "--json".as_ref(), &from, &to]);
            r.ok();
            assert_eq!(summary_field(&r, "files_copied"), copies, "{r}");
        }
    }
    assert_trees_equal(&src, &there);
    assert_trees_equal(&src, &back);
}

/// `ferry copy` with the server's -e, this build as the remote ferry and
/// `args`, started and not waited for (its output dropped): for killing.
fn spawn_copy(rsh: &str, args: &[&std::ffi::OsStr]) -> std::process::Child {
    let mut a: Vec<&std::ffi::OsStr> = vec![
        "copy".as_ref(),
        "-e".as_ref(),
        rsh.as_ref(),
        "--remote-ferry".as_ref(),
    ];
    let b = bin();
    a.push(&b);
    a.extend_from_slice(args);
    std::process::Command::new(bin())
        .args(a)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// The number just before `phrase` in a run's output (0 when absent).
fn figure_before(r: &Run, phrase: &str) -> u64 {
    r.all()
        .lines()
        .find_map(|l| {
            l.split_once(phrase)
                .and_then(|(a, _)| a.rsplit(' ').next()?.parse::<u64>().ok())
        })
        .unwrap_or(0)
}

#[test]
fn local_ferry_killed_then_rerun_leaves_no_temporaries() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let src = d.path().join("src");
    for i in 0..30 {
        write(&src, format!("f{i:02}"), &gen_bytes(300_000, i));
    }
    let dst = d.path().join("dst");
    let mut child = spawn_copy(
        &rsh,
        &[
            "--bwlimit".as_ref(),
            "1M".as_ref(),
            src.as_os_str(),
            &at(&host, &dst),
        ],
    );
    wait_until("the copy did not start", 400, || {
        dst.exists() && std::fs::read_dir(&dst).unwrap().count() >= 2
    });
    child.kill().unwrap();
    child.wait().unwrap();
    remote(&rsh, &["copy".as_ref(), src.as_os_str(), &at(&host, &dst)]).ok();
    assert_trees_equal(&src, &dst);
    // The remote ends of the killed run are gone with their temporaries.
    let mut left = Vec::new();
    for _ in 0..100 {
        left = find_prefixed(&dst, b".ferry-");
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(left.is_empty(), "{left:?}");
}

/// A big file pushed and pulled with --connections 3 is byte-equal; a
/// pull killed part way resumes from the ranges that arrived.
#[test]
fn big_file_over_three_connections_and_a_resumed_pull() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let data = gen_bytes((64 << 20) + 1, 64);
    write(d.path(), "src/big", &data);
    let there = d.path().join("there");
    let three: [&std::ffi::OsStr; 2] = ["--connections".as_ref(), "3".as_ref()];
    let copy = |from: &std::ffi::OsStr, to: &std::ffi::OsStr, extra: &[&std::ffi::OsStr]| {
        let mut a: Vec<&std::ffi::OsStr> = vec!["copy".as_ref()];
        a.extend_from_slice(extra);
        a.extend([from, to]);
        remote(&rsh, &a)
    };
    copy(d.path().join("src").as_os_str(), &at(&host, &there), &three).ok();
    assert!(std::fs::read(there.join("big")).unwrap() == data);
    let back = d.path().join("back");
    copy(&at(&host, &there), back.as_os_str(), &three).ok();
    assert!(std::fs::read(back.join("big")).unwrap() == data);
    // A pull killed part way: the partial stays, the rerun fetches the rest.
    let again = d.path().join("again");
    let mut child = spawn_copy(
        &rsh,
        &[
            "--bwlimit".as_ref(),
            "8M".as_ref(),
            &at(&host, &there),
            again.as_os_str(),
        ],
    );
    // Two seconds after the partial appears (its ranges are recorded every
    // second): some of it has arrived and is on record.
    let mut seen = 0;
    wait_until("the pull did not start", 600, || {
        if again.exists() && !find_prefixed(&again, b".ferry-part-").is_empty() {
            seen += 1;
        }
        seen >= 40
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let r = copy(&at(&host, &there), again.as_os_str(), &["-v".as_ref()]);
    r.ok();
    assert!(std::fs::read(again.join("big")).unwrap() == data);
    let reused = figure_before(&r, " bytes of interrupted downloads reused");
    assert!(reused > 0, "nothing resumed\n{r}");
    assert!(find_prefixed(&again, b".ferry-").is_empty());
}

/// A big file's bytes go from the file into ssh's pipe by splice on the sending end and
/// are read into aligned buffers on the receiving end; with `FERRY_NO_SPLICE` on both
/// ends they are read and copied. Both ways, pushed and pulled, the file arrives whole
/// (its last bytes short of a page too), with its mtime, and nothing is left beside it.
#[test]
fn big_files_spliced_or_copied_arrive_whole() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let data = gen_bytes((40 << 20) + 4097, 40);
    write(d.path(), "src/big", &data);
    let src = d.path().join("src");
    for copying in [false, true] {
        let tag = if copying { "copied" } else { "spliced" };
        let there = d.path().join(format!("there-{tag}"));
        let back = d.path().join(format!("back-{tag}"));
        let run = |from: &std::ffi::OsStr, to: &std::ffi::OsStr| {
            let mut remote_ferry = OsString::new();
            if copying {
                remote_ferry.push("FERRY_NO_SPLICE=1 ");
            }
            remote_ferry.push(bin());
            let mut c = std::process::Command::new(bin());
            c.args([
                "copy".as_ref(),
                "-e".as_ref(),
                rsh.as_ref() as &std::ffi::OsStr,
            ])
            .arg("--remote-ferry")
            .arg(&remote_ferry)
            .args([from, to])
            .stdin(std::process::Stdio::null());
            if copying {
                c.env("FERRY_NO_SPLICE", "1");
            }
            run_within(c, Duration::from_secs(600))
        };
        run(src.as_os_str(), &at(&host, &there)).ok();
        assert!(
            std::fs::read(there.join("big")).unwrap() == data,
            "{tag} push"
        );
        run(&at(&host, &there), back.as_os_str()).ok();
        assert!(
            std::fs::read(back.join("big")).unwrap() == data,
            "{tag} pull"
        );
        let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        assert_eq!(mtime(&back.join("big")), mtime(&src.join("big")), "{tag}");
        assert!(find_prefixed(&there, b".ferry-").is_empty(), "{tag}");
        assert!(find_prefixed(&back, b".ferry-").is_empty(), "{tag}");
    }
}

/// A big push goes in ranges over several connections into a resumable partial there: a
/// push killed part way leaves the partial with its record, the rerun sends only the rest
/// (`-v` says how much it reused), and the result is whole, with nothing left beside it.
#[test]
fn big_push_over_connections_resumes_after_a_kill() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let data = gen_bytes((48 << 20) + 3, 48);
    write(d.path(), "src/big", &data);
    let src = d.path().join("src");
    let there = d.path().join("there");
    let mut child = spawn_copy(
        &rsh,
        &[
            "--connections".as_ref(),
            "3".as_ref(),
            "--bwlimit".as_ref(),
            "8M".as_ref(),
            src.as_os_str(),
            &at(&host, &there),
        ],
    );
    // Killed once the partial there has ranges on record (flushed and
    // recorded every two seconds).
    let recorded = |dir: &Path| {
        find_prefixed(dir, b".ferry-part-").iter().any(|p| {
            xattrs_of(&dir.join(p))
                .get(&b"user.ferry.partial"[..])
                .is_some_and(|v| {
                    v.split(|&b| b == b'\n')
                        .nth(3)
                        .is_some_and(|l| !l.is_empty())
                })
        })
    };
    wait_until("the push did not start", 600, || {
        there.exists() && recorded(&there)
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!there.join("big").exists());
    let r = remote(
        &rsh,
        &[
            "copy".as_ref(),
            "-v".as_ref(),
            src.as_os_str(),
            &at(&host, &there),
        ],
    );
    r.ok();
    assert!(std::fs::read(there.join("big")).unwrap() == data);
    let reused = figure_before(&r, " bytes of interrupted pushes reused");
    assert!(
        reused > 0 && reused < data.len() as u64,
        "nothing resumed\n{r}"
    );
    assert!(find_prefixed(&there, b".ferry-").is_empty());
}

// ------------------------------------------------------------- what -a -X -A keeps

/// Every attribute of `p` (not following a symlink), by the syscalls.
fn xattrs_of(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    let n = rustix::fs::llistxattr(c.as_c_str(), &mut names[..]).unwrap();
    let mut out = BTreeMap::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = std::ffi::CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        let len = rustix::fs::lgetxattr(c.as_c_str(), cn.as_c_str(), &mut v[..]).unwrap();
        out.insert(name.to_vec(), v[..len].to_vec());
    }
    out
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(p, name, value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setxattr {} {name}: {e}", p.display()));
}

/// A POSIX ACL as the kernel's raw value: owner, named user 4242 (with
/// `perm`), group, mask, other.
fn acl_value(perm: u16) -> Vec<u8> {
    const UNDEF: u32 = u32::MAX;
    let mut out = 2u32.to_le_bytes().to_vec();
    for (tag, p, id) in [
        (0x01u16, 7u16, UNDEF),
        (0x02, perm, 4242),
        (0x04, 5, UNDEF),
        (0x10, 7, UNDEF),
        (0x20, 0, UNDEF),
    ] {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&p.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

/// The attributes of every entry of `a` and `b` (roots included) are equal.
#[track_caller]
fn assert_same_xattrs(a: &Path, b: &Path, r: &Run) {
    let mut paths = vec![std::path::PathBuf::new()];
    paths.extend(walk(a));
    for rel in paths {
        assert_eq!(
            xattrs_of(&a.join(&rel)),
            xattrs_of(&b.join(&rel)),
            "attributes of {rel:?} (left SRC, right DST)\n{r}"
        );
    }
}

/// -X -A over ssh keep user attributes (binary values, on a small file, a
/// big one, a directory, a symlink) and access and default ACLs, pushed,
/// changed and synced again (attributes only), and pulled.
#[test]
fn xattrs_and_acls_pushed_and_pulled() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let src = d.path().join("src");
    write(&src, "small", b"small file");
    write(&src, "big", &gen_bytes(700 << 10, 1));
    write(&src, "dir/inner", b"inner");
    std::os::unix::fs::symlink("small", src.join("link")).unwrap();
    if rustix::fs::lsetxattr(&src, "user.probe", b"1", rustix::fs::XattrFlags::empty()).is_err() {
        eprintln!("skipped: {} keeps no user attributes", src.display());
        return;
    }
    rustix::fs::lremovexattr(&src, "user.probe").unwrap();
    set_xattr(&src.join("small"), "user.bin", b"\0\xff\x01 binary");
    set_xattr(&src.join("small"), "user.second", &[7u8; 3000]);
    set_xattr(&src.join("big"), "user.big", b"on a big file");
    set_xattr(&src.join("dir"), "user.dir", b"on a directory");
    set_xattr(&src.join("big"), "system.posix_acl_access", &acl_value(4));
    set_xattr(&src.join("dir"), "system.posix_acl_access", &acl_value(5));
    set_xattr(&src.join("dir"), "system.posix_acl_default", &acl_value(6));
    if is_root() {
        set_xattr(&src.join("link"), "trusted.link", b"on a symlink");
    }
    let dst = d.path().join("dst");
    let push = || {
        remote(
            &rsh,
            &[
                "sync".as_ref(),
                "-XA".as_ref(),
                "--json".as_ref(),
                src.as_os_str(),
                &at(&host, &dst),
            ],
        )
    };
    let r = push();
    r.ok();
    assert!(!r.err().contains("keeps none"), "{r}");
    assert_same_xattrs(&src, &dst, &r);
    assert_trees_equal(&src, &dst);
    // Attributes changed, bytes not: the attributes follow, no file is copied.
    set_xattr(&src.join("small"), "user.bin", b"new value");
    rustix::fs::lremovexattr(src.join("small"), "user.second").unwrap();
    set_xattr(&src.join("big"), "system.posix_acl_access", &acl_value(6));
    let r = push();
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    assert_same_xattrs(&src, &dst, &r);
    // Pulled back into a new tree.
    let back = d.path().join("back");
    let r = remote(
        &rsh,
        &[
            "copy".as_ref(),
            "-XA".as_ref(),
            &at(&host, &dst),
            back.as_os_str(),
        ],
    );
    r.ok();
    assert_same_xattrs(&src, &back, &r);
    // Remote to remote.
    let far = d.path().join("far");
    let r = remote(
        &rsh,
        &[
            "copy".as_ref(),
            "-XA".as_ref(),
            &at(&host, &dst),
            &at(&host, &far),
        ],
    );
    r.ok();
    assert_same_xattrs(&src, &far, &r);
}

/// Type, device number, mode and mtime of `rel` equal in both trees.
#[track_caller]
fn assert_same_node(a: &Path, b: &Path, rel: &str, r: &Run) {
    use std::os::unix::fs::MetadataExt;
    let f = |p: &Path| {
        let m = std::fs::symlink_metadata(p.join(rel))
            .unwrap_or_else(|e| panic!("{}: {e}\n{r}", p.join(rel).display()));
        (m.mode(), m.rdev(), m.mtime(), m.mtime_nsec(), m.uid())
    };
    assert_eq!(f(a), f(b), "{rel}: (mode, rdev, mtime, ns, uid)\n{r}");
}

/// Fifos (and as root device nodes) pushed to and pulled from the remote.
#[test]
fn fifos_and_devices_pushed_and_pulled() {
    use rustix::fs::{self as rfs, FileType, Mode};
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let src = d.path().join("src");
    write(&src, "sub/file", b"x");
    let mut nodes = vec![
        ("fifo", FileType::Fifo, 0),
        ("sub/fifo2", FileType::Fifo, 0),
    ];
    if is_root() {
        nodes.push(("null", FileType::CharacterDevice, rfs::makedev(1, 3)));
        nodes.push(("blk", FileType::BlockDevice, rfs::makedev(7, 200)));
    }
    for (rel, ft, dev) in &nodes {
        rfs::mknodat(
            rfs::CWD,
            src.join(rel),
            *ft,
            Mode::from_raw_mode(0o640),
            *dev,
        )
        .unwrap();
    }
    set_mtime(&src.join("fifo"), (1_234_567, 89));
    let dst = d.path().join("dst");
    let r = remote(&rsh, &["sync".as_ref(), src.as_os_str(), &at(&host, &dst)]);
    r.ok();
    assert!(!r.err().contains("skipped"), "{r}");
    let back = d.path().join("back");
    let r2 = remote(&rsh, &["copy".as_ref(), &at(&host, &dst), back.as_os_str()]);
    r2.ok();
    for (rel, ..) in &nodes {
        assert_same_node(&src, &dst, rel, &r);
        assert_same_node(&src, &back, rel, &r2);
    }
    // A fifo that became a file and back: replaced on the remote.
    std::fs::remove_file(src.join("fifo")).unwrap();
    write(&src, "fifo", b"now a file");
    remote(&rsh, &["sync".as_ref(), src.as_os_str(), &at(&host, &dst)]).ok();
    assert_eq!(std::fs::read(dst.join("fifo")).unwrap(), b"now a file");
}

/// The data segments of a file (`SEEK_DATA`/`SEEK_HOLE`).
fn seek_map(p: &Path) -> Vec<(u64, u64)> {
    use rustix::fs::{self as rfs, SeekFrom};
    use std::os::fd::AsFd;
    let f = std::fs::File::open(p).unwrap();
    let size = f.metadata().unwrap().len();
    let (mut out, mut off) = (Vec::new(), 0);
    while off < size {
        let Ok(data) = rfs::seek(f.as_fd(), SeekFrom::Data(off)) else {
            break;
        };
        let hole = rfs::seek(f.as_fd(), SeekFrom::Hole(data)).unwrap();
        out.push((data, hole));
        off = hole;
    }
    out
}

/// A file of `size` bytes whose only data are `segs` (offset, length).
fn write_sparse(p: &Path, size: u64, segs: &[(u64, usize)]) {
    use std::os::unix::fs::FileExt;
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let f = std::fs::File::create(p).unwrap();
    for (i, &(off, len)) in segs.iter().enumerate() {
        let mut b = gen_bytes(len, i as u64 + 7);
        b.iter_mut().for_each(|x| *x |= 1);
        f.write_all_at(&b, off).unwrap();
    }
    f.set_len(size).unwrap();
}

/// Sparse files (holes at the start, the middle and the end; a small one
/// that travels whole, a big one, a gibibyte with a mebibyte of data)
/// pushed, pulled and copied remote to remote keep their hole maps and
/// bytes; a rerun copies nothing.
#[test]
fn sparse_files_pushed_and_pulled_keep_their_holes() {
    use std::os::unix::fs::MetadataExt;
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let src = d.path().join("src");
    const M: u64 = 1 << 20;
    write_sparse(&src.join("small"), 200 << 10, &[(64 << 10, 8192)]);
    write_sparse(
        &src.join("big"),
        40 * M,
        &[
            (3 * M, 100_000),
            (5 * M + 4096, 2 * M as usize),
            (30 * M, 4096),
        ],
    );
    write_sparse(
        &src.join("gib"),
        1 << 30,
        &[(100 * M, M as usize / 2), (600 * M, M as usize / 2)],
    );
    write(&src, "dense", &gen_bytes(3 << 20, 5));
    if seek_map(&src.join("big")).len() != 3 {
        eprintln!(
            "skipped: the filesystem of {} reports no holes",
            src.display()
        );
        return;
    }
    let on_disk = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
    let check = |a: &Path, b: &Path, r: &Run| {
        for f in ["small", "big", "gib", "dense"] {
            assert_eq!(seek_map(&a.join(f)), seek_map(&b.join(f)), "{f}\n{r}");
        }
        assert!(on_disk(&b.join("gib")) < 2 * M, "{r}");
        assert_trees_equal(a, b);
    };
    let dst = d.path().join("dst");
    let push = || {
        remote(
            &rsh,
            &[
                "sync".as_ref(),
                "--json".as_ref(),
                src.as_os_str(),
                &at(&host, &dst),
            ],
        )
    };
    let start = std::time::Instant::now();
    let r = push();
    r.ok();
    check(&src, &dst, &r);
    eprintln!("push took {:?}", start.elapsed());
    let r = push();
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    let back = d.path().join("back");
    let pull = || {
        remote(
            &rsh,
            &[
                "sync".as_ref(),
                "--json".as_ref(),
                &at(&host, &dst),
                back.as_os_str(),
            ],
        )
    };
    let r = pull();
    r.ok();
    check(&src, &back, &r);
    let r = pull();
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    let far = d.path().join("far");
    let r = remote(&rsh, &["copy".as_ref(), &at(&host, &dst), &at(&host, &far)]);
    r.ok();
    check(&src, &far, &r);
}

/// Small files are committed without waiting for each reply (their Puts
/// are confirmed in the background): files the remote cannot create (a
/// directory there made immutable) each fail with one line naming the
/// path, exit 1, are never reported copied, and the others are copied,
/// pushed with -v and with --json. (CI runs this behind the 20 ms round
/// trip too.)
#[test]
fn files_the_remote_refuses_fail_one_line_each_and_the_rest_are_copied() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let (src, there) = (d.path().join("src"), d.path().join("there"));
    for dir in ["a", "b", "c"] {
        for i in 0..40 {
            write(&src, format!("{dir}/f{i:02}"), &gen_bytes(4096, i));
        }
    }
    // `b` exists there already with the source's metadata (nothing to
    // set on it) and nothing can be created in it.
    std::fs::create_dir_all(there.join("b")).unwrap();
    set_mtime(&there.join("b"), get_mtime(&src.join("b")));
    let Some(_guard) = Immutable::try_set(&there.join("b")) else {
        eprintln!("skipped: chattr +i is not available here");
        return;
    };
    let to = at(&host, &there);
    for out in ["-v", "--json"] {
        let r = remote(&rsh, &["copy".as_ref(), out.as_ref(), src.as_os_str(), &to]);
        r.code_is(1);
        let mut errs = r.error_lines();
        errs.sort();
        assert_eq!(errs.len(), 40, "{r}");
        for (i, l) in errs.iter().enumerate() {
            assert!(l.starts_with(&format!("ferry: b/f{i:02}: ")), "{l}\n{r}");
        }
        // Only what the remote confirmed is reported copied.
        let stdout = r.out();
        let copied: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("copy ") || l.contains("\"type\":\"copy\""))
            .map(|l| {
                if out == "-v" {
                    &l[5..]
                } else {
                    l.split("\"path\":\"")
                        .nth(1)
                        .unwrap()
                        .split('"')
                        .next()
                        .unwrap()
                }
            })
            .filter(|p| p.contains('/'))
            .collect();
        assert_eq!(copied.len(), 80, "{r}");
        assert!(copied.iter().all(|p| !p.starts_with("b/")), "{r}");
        if out == "--json" {
            assert_eq!(summary_field(&r, "errors"), 40, "{r}");
            assert_eq!(summary_field(&r, "files_copied"), 80, "{r}");
        }
        std::fs::remove_dir_all(there.join("a")).unwrap();
        std::fs::remove_dir_all(there.join("c")).unwrap();
    }
    // Nothing half-written anywhere, nothing at all in `b`.
    assert!(find_prefixed(&there, TMP_PREFIX).is_empty());
    assert_eq!(std::fs::read_dir(there.join("b")).unwrap().count(), 0);
    drop(_guard);
    // Once the remote can create them, a rerun copies exactly those.
    let r = remote(
        &rsh,
        &["copy".as_ref(), "--json".as_ref(), src.as_os_str(), &to],
    );
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 120, "{r}");
    assert_trees_equal(&src, &there);
}

// ------------------------------------------------------------------ ~ and ~user

/// The login directory of the test server's user, and the user's name, as
/// the server has them (`pwd` and `id -un` there).
pub fn remote_home(rsh: &str, host: &str) -> (std::path::PathBuf, String) {
    let ask = |cmd: &str| {
        let mut argv = rsh.split_whitespace();
        let out = std::process::Command::new(argv.next().unwrap())
            .args(argv)
            .arg(host)
            .arg(cmd)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    (ask("pwd").into(), ask("id -un"))
}

/// A directory under the remote home, removed when dropped.
struct HomeDir(std::path::PathBuf);

impl Drop for HomeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `host:~/path` and `host:~user/path` name the path in the remote home,
/// as with rsync and scp, pushed to (a new directory there: its parent is
/// `~`) and pulled from, over ferry and over SFTP (`--sftp`); `~` alone is
/// the home; an unknown user is one line, exit 2.
#[test]
fn tilde_paths_are_in_the_remote_home() {
    let (rsh, host) = need_server!();
    let (home, user) = remote_home(&rsh, &host);
    let d = tmpdir();
    let src = d.path().join("src");
    write(&src, "a", b"alpha");
    write(&src, "sub/b", &gen_bytes(300_000, 4));
    // Big enough to go in ranges, by path, over several connections.
    write(&src, "sub/big", &gen_bytes(33 << 20, 5));
    // Whole seconds: what SFTP keeps.
    for rel in walk(&src).iter().chain([&std::path::PathBuf::new()]) {
        set_mtime(&src.join(rel), (1_700_000_000, 0));
    }
    let name = format!(".ferry-test-tilde-{}", std::process::id());
    let there = HomeDir(home.join(&name));
    for sftp in [false, true] {
        let _ = std::fs::remove_dir_all(&there.0);
        let flags: Vec<&str> = if sftp { vec!["--sftp"] } else { vec![] };
        let run = |args: &[&OsStr]| {
            let mut a: Vec<&OsStr> = vec![args[0]];
            a.extend(flags.iter().map(|f| OsStr::new(*f)));
            a.extend(&args[1..]);
            remote(&rsh, &a)
        };
        let dst = OsString::from(format!("{host}:~/{name}"));
        run(&["sync".as_ref(), src.as_os_str(), &dst]).ok();
        assert_trees_equal(&src, &there.0);
        let back = d.path().join(format!("back{sftp}"));
        let from = OsString::from(format!("{host}:~{user}/{name}/"));
        run(&["sync".as_ref(), &from, back.as_os_str()]).ok();
        assert_trees_equal(&src, &back);
        // One file into `~` itself, and back from `~/name`.
        let one = d.path().join("one");
        std::fs::write(&one, b"one file").unwrap();
        let home_at = OsString::from(format!("{host}:~"));
        run(&["copy".as_ref(), one.as_os_str(), &home_at]).ok();
        let landed = home.join("one");
        assert_eq!(std::fs::read(&landed).unwrap(), b"one file");
        std::fs::remove_file(&landed).unwrap();
        let r = run(&[
            "sync".as_ref(),
            src.as_os_str(),
            format!("{host}:~no-such-user-{}/x", std::process::id()).as_ref(),
        ]);
        r.code_is(2);
        let lines = r.error_lines();
        assert_eq!(lines.len(), 1, "{r}");
        assert!(lines[0].contains("no such user"), "{r}");
    }
}

/// The summary's time is the whole command's: an ssh that takes 2 s to
/// connect (a -e wrapper sleeping first) makes a run of at least 2 s,
/// copy and bisync (it was the copying alone: "in 0.02 s").
#[test]
fn the_summary_time_includes_connecting() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let src = d.path().join("src");
    write(&src, "a", b"alpha");
    let slow = d.path().join("slow-ssh");
    std::fs::write(&slow, format!("#!/bin/sh\nsleep 2\nexec {rsh} \"$@\"\n")).unwrap();
    chmod(&slow, 0o755);
    let slow = slow.to_str().unwrap();
    let elapsed = |r: &Run| {
        let line = r
            .out()
            .lines()
            .rev()
            .find(|l| l.contains("\"type\":\"summary\""))
            .unwrap_or_else(|| panic!("no summary\n{r}"))
            .to_owned();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        v["elapsed_s"].as_f64().unwrap()
    };
    let dst = d.path().join("dst");
    let r = remote(
        slow,
        &[
            "copy".as_ref(),
            "--json".as_ref(),
            src.as_os_str(),
            &at(&host, &dst),
        ],
    );
    r.ok();
    assert!(elapsed(&r) >= 2.0, "{r}");
    let b = d.path().join("b");
    let r = remote(
        slow,
        &[
            "bisync".as_ref(),
            "--json".as_ref(),
            src.as_os_str(),
            &at(&host, &b),
        ],
    );
    r.ok();
    assert!(elapsed(&r) >= 2.0, "{r}");
}

/// A big pull whose remote end is killed midway: with -v the note of the
/// bytes written with O_DIRECT counts those of the pull that failed (it
/// said 0: only finished downloads were counted). Where the local
/// filesystem takes no O_DIRECT (tmpfs) there is nothing to count.
#[test]
fn o_direct_bytes_of_a_killed_pull_are_counted() {
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let fs = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(d.path())
        .output()
        .unwrap();
    let fs = String::from_utf8_lossy(&fs.stdout).trim().to_string();
    if !["ext2/ext3", "xfs", "btrfs", "f2fs"].contains(&fs.as_str()) {
        eprintln!(
            "skipped: {} is {fs}, which takes no O_DIRECT here",
            d.path().display()
        );
        return;
    }
    let data = gen_bytes(48 << 20, 77);
    write(d.path(), "src/big", &data);
    let src = d.path().join("src");
    let back = d.path().join("back");
    let pidf = d.path().join("serve.pids");
    let wrapper = d.path().join("ferry-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho $$ >> '{}'\nexec '{}' \"$@\"\n",
            pidf.display(),
            bin().to_string_lossy()
        ),
    )
    .unwrap();
    chmod(&wrapper, 0o755);
    let mut cmd = std::process::Command::new(bin());
    cmd.args([
        "copy".as_ref(),
        "-v".as_ref(),
        "-e".as_ref(),
        rsh.as_ref() as &std::ffi::OsStr,
        "--remote-ferry".as_ref(),
        wrapper.as_os_str(),
        "--bwlimit".as_ref(),
        "8M".as_ref(),
        &at(&host, &src),
        back.as_os_str(),
    ])
    .stdin(std::process::Stdio::null());
    let pull = std::thread::spawn(move || run_within(cmd, Duration::from_secs(300)));
    // Killed once the partial here holds 8 MiB.
    let written = |dir: &Path| {
        use std::os::unix::fs::MetadataExt;
        find_prefixed(dir, b".ferry-part-")
            .iter()
            .any(|p| std::fs::metadata(dir.join(p)).is_ok_and(|m| m.blocks() * 512 >= 8 << 20))
    };
    wait_until("the pull did not start", 2400, || {
        back.exists() && written(&back)
    });
    for pid in std::fs::read_to_string(&pidf).unwrap().split_whitespace() {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .status();
    }
    let r = pull.join().unwrap();
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.err().contains("connection lost"), "{r}");
    let direct = figure_before(&r, " bytes of downloads written with O_DIRECT");
    assert!(direct >= 4 << 20, "{direct}\n{r}");
}

/// A big push killed once its partial has ranges on record, then its
/// source changed in place (same inode, size and mtime: what names it in
/// the record): the rerun reuses the ranges, checks the whole file at the
/// end (the reused ranges read back and compared), sends again what
/// differs, and the file there is the new content, byte for byte.
#[test]
fn a_resumed_push_of_a_source_changed_in_place_is_checked_whole() {
    use std::os::unix::fs::MetadataExt;
    let (rsh, host) = need_server!();
    let d = tmpdir();
    let size = (48 << 20) + 3;
    write(d.path(), "src/big", &gen_bytes(size, 48));
    let src = d.path().join("src");
    let big = src.join("big");
    let there = d.path().join("there");
    let mut child = spawn_copy(
        &rsh,
        &[
            "--connections".as_ref(),
            "3".as_ref(),
            "--bwlimit".as_ref(),
            "8M".as_ref(),
            src.as_os_str(),
            &at(&host, &there),
        ],
    );
    let recorded = |dir: &Path| {
        find_prefixed(dir, b".ferry-part-").iter().any(|p| {
            xattrs_of(&dir.join(p))
                .get(&b"user.ferry.partial"[..])
                .is_some_and(|v| {
                    v.split(|&b| b == b'\n')
                        .nth(3)
                        .is_some_and(|l| !l.is_empty())
                })
        })
    };
    wait_until("the push did not start", 2400, || {
        there.exists() && recorded(&there)
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let before = std::fs::metadata(&big).unwrap();
    let new = gen_bytes(size, 49);
    rewrite_keep_meta(&big, &new);
    let after = std::fs::metadata(&big).unwrap();
    assert_eq!(
        (
            before.ino(),
            before.size(),
            before.mtime(),
            before.mtime_nsec()
        ),
        (after.ino(), after.size(), after.mtime(), after.mtime_nsec())
    );
    let r = remote(
        &rsh,
        &[
            "copy".as_ref(),
            "-v".as_ref(),
            src.as_os_str(),
            &at(&host, &there),
        ],
    );
    r.ok();
    assert!(
        figure_before(&r, " bytes of interrupted pushes reused") > 0,
        "{r}"
    );
    assert!(figure_before(&r, " bytes sent again") > 0, "{r}");
    assert!(std::fs::read(there.join("big")).unwrap() == new, "{r}");
    assert!(find_prefixed(&there, b".ferry-").is_empty());
}

// ------------------------------------------------------------------ listings asked ahead

/// A store on `p` for a run that walks it (its root's listing asked with
/// its `StatRoot`, the tree listed ahead there), and one on `q` that
/// shares its connection.
fn walking(p: &Path, q: &Path) -> Result<(SshStore, SshStore), String> {
    let (rsh, host) = server()?;
    let set = ferry_ssh::Settings {
        rsh: Some(rsh),
        remote_ferry: Some(bin().to_string_lossy().into_owned()),
        ..Default::default()
    };
    let t = Target::with(&host, None, &set)?;
    let a = SshStore::open_walking(&t, p.as_os_str().as_bytes(), true)?;
    let b = SshStore::open(&t, q.as_os_str().as_bytes())?;
    Ok((a, b))
}

fn names(s: &SshStore, d: &<SshStore as ferry_engine::store::Store>::Dir) -> Vec<String> {
    use ferry_engine::store::Store;
    let mut l = ferry_engine::entry::Listing::new();
    s.list(d, b"", &mut l, &mut Vec::new()).unwrap();
    l.entries()
        .iter()
        .map(|e| String::from_utf8_lossy(l.name(e)).into_owned())
        .collect()
}

/// The root's listing asked right behind its `StatRoot` (protocol 15) is
/// not what the walk's first listing gets once a change was asked for in
/// between (here: a directory made in it through another store on the
/// same connection), nor once it is older than its freshness (here: a
/// directory made behind ferry's back after that).
#[test]
fn a_root_listing_asked_ahead_is_not_used_after_a_change_or_once_stale() {
    use ferry_engine::store::Store;
    if let Err(why) = server() {
        crate::util::skip(&why);
        return;
    }
    let d = tmpdir();
    write(d.path(), "t/a", b"a");
    let t = d.path().join("t");
    // A change asked for in between.
    let (s, other) = walking(&t, d.path()).unwrap();
    assert!(s.stat_root(t.as_os_str().as_bytes()).unwrap().is_some());
    // (Its listing answered by then: made before the change.)
    std::thread::sleep(Duration::from_millis(500));
    let (up, _) = other.open_root().unwrap().unwrap();
    let dir = other.open_dir(&up, c"t").unwrap();
    other.make_dir(&dir, c"made").unwrap();
    let (root, _) = s.open_root().unwrap().unwrap();
    assert_eq!(names(&s, &root), ["a", "made"]);
    // Stale: asked, then more than its freshness later, a change behind
    // ferry's back (which its own ahead would not show either).
    let (s, _) = walking(&t, d.path()).unwrap();
    assert!(s.stat_root(t.as_os_str().as_bytes()).unwrap().is_some());
    std::thread::sleep(Duration::from_millis(3300));
    std::fs::create_dir(t.join("later")).unwrap();
    let (root, _) = s.open_root().unwrap().unwrap();
    assert_eq!(names(&s, &root), ["a", "later", "made"]);
    // Neither: taken, and what the listing says then.
    let (s, _) = walking(&t, d.path()).unwrap();
    assert!(s.stat_root(t.as_os_str().as_bytes()).unwrap().is_some());
    let (root, _) = s.open_root().unwrap().unwrap();
    assert_eq!(names(&s, &root), ["a", "later", "made"]);
}
