//! The SFTP backend end to end against a real OpenSSH server
//! (`scripts/sshd`: `FERRY_TEST_SSH_*`, and `FERRY_TEST_SFTP_*` for its
//! internal-sftp chroot, which has no shell and no ferry): random trees
//! pushed and pulled over `sftp://`, `host:path` falling back to SFTP
//! where ferry cannot run (said once), `--sftp`, the one-line errors, a
//! big push killed and run again, and the server killed or frozen mid-push. Every test skips with a line saying so
//! when the server is not set up. The server is this machine, so remote
//! trees are checked on disk.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::ssh::{gen_tree, node, ssh_server as server};
use crate::util::*;
use proptest::prelude::*;

/// The chroot: (its host alias, its writable directory here, the same as
/// the server names it).
fn chroot() -> Result<(String, PathBuf, String), String> {
    let v = |k: &str| {
        std::env::var(format!("FERRY_TEST_SFTP_{k}"))
            .map_err(|_| format!("FERRY_TEST_SFTP_{k} is not set (scripts/sshd as root)"))
    };
    Ok((v("HOST")?, v("ROOT")?.into(), v("PATH")?))
}

fn url(host: &str, p: &Path) -> OsString {
    format!("sftp://{host}{}", p.display()).into()
}

fn at(host: &str, p: &str) -> OsString {
    format!("{host}:{p}").into()
}

/// ferry with the test server's -e.
fn run(rsh: &str, args: &[&OsStr]) -> Run {
    let mut a: Vec<OsString> = vec![args[0].into(), "-e".into(), rsh.into()];
    a.extend(args[1..].iter().map(|s| s.to_os_string()));
    ferry(&a)
}

// ------------------------------------------------------------------ random trees

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, failure_persistence: None, ..ProptestConfig::default() })]

    /// A random tree pushed to sftp:// and pulled back is equal in bytes
    /// and metadata; the second push and pull copy nothing.
    #[test]
    fn random_trees_push_and_pull(g in gen_tree(false)) {
        let Ok((rsh, host)) = server() else {
            crate::util::skip(&"FERRY_TEST_SSH_* not set");
            return Ok(());
        };
        let d = tmpdir();
        let (src, there, back) = (d.path().join("src"), d.path().join("there"), d.path().join("back"));
        materialize(&src, &node(&g));
        let there_at = url(&host, &there);
        let push: Vec<&OsStr> = vec!["sync".as_ref(), "--json".as_ref(), src.as_os_str(), &there_at];
        run(&rsh, &push).ok();
        assert_trees_equal(&src, &there);
        let r = run(&rsh, &push);
        r.ok();
        prop_assert_eq!(summary(&r).files_copied, 0, "{}", r);
        let pull: Vec<&OsStr> = vec!["sync".as_ref(), "--json".as_ref(), &there_at, back.as_os_str()];
        run(&rsh, &pull).ok();
        assert_trees_equal(&src, &back);
        let r = run(&rsh, &pull);
        r.ok();
        prop_assert_eq!(summary(&r).files_copied, 0, "{}", r);
    }
}

/// A few entries, with whole-second mtimes (what SFTP keeps).
fn small_tree(root: &Path) {
    write(root, "a", b"alpha");
    write(root, "sub/b", &gen_bytes(300_000, 2));
    ln(root, "sub/l", "../a");
    for (i, rel) in walk(root).iter().rev().enumerate() {
        set_mtime(&root.join(rel), (1_700_000_000 + i as i64, 0));
    }
    set_mtime(root, (1_600_000_000, 0));
}

// ------------------------------------------------------------------ fallback, --sftp

/// `host:path` on the internal-sftp chroot (no shell, no ferry): pushed
/// and pulled over SFTP, with one note saying so.
#[test]
fn host_path_falls_back_to_sftp_where_ferry_cannot_run() {
    let (rsh, _) = need!(server());
    let (host, local, remote) = need!(chroot());
    let d = tmpdir();
    let src = d.path().join("src");
    small_tree(&src);
    let there = tempfile::tempdir_in(&local).unwrap();
    let name = there.path().file_name().unwrap().to_str().unwrap();
    let dst = at(&host, &format!("{remote}/{name}/t"));
    let r = run(&rsh, &["copy".as_ref(), src.as_os_str(), &dst]);
    r.ok();
    assert_eq!(
        r.err().matches("ferry: note: ferry cannot run on").count(),
        1,
        "{r}"
    );
    assert!(r.err().contains("using SFTP"), "{r}");
    assert_trees_equal(&src, &there.path().join("t"));
    let back = d.path().join("back");
    let r = run(&rsh, &["copy".as_ref(), &dst, back.as_os_str()]);
    r.ok();
    assert_eq!(r.err().matches("ferry: note:").count(), 1, "{r}");
    assert_trees_equal(&src, &back);
}

/// `--no-remote-install` and no ferry on the remote's PATH: SFTP, said once.
#[test]
fn no_remote_install_without_a_remote_ferry_falls_back_to_sftp() {
    let (rsh, host) = need!(server());
    if std::process::Command::new("sh")
        .args(["-c", "command -v ferry"])
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("skipped: a ferry is on this machine's PATH");
        return;
    }
    let d = tmpdir();
    let src = d.path().join("src");
    small_tree(&src);
    let dst = d.path().join("dst");
    let r = run(
        &rsh,
        &[
            "copy".as_ref(),
            "--no-remote-install".as_ref(),
            src.as_os_str(),
            &at(&host, dst.to_str().unwrap()),
        ],
    );
    r.ok();
    assert_eq!(
        r.err().matches("ferry: note: ferry cannot run on").count(),
        1,
        "{r}"
    );
    assert_trees_equal(&src, &dst);
}

/// `--sftp` reaches `host:path` over SFTP from the start: a remote ferry
/// that does not exist is never asked for, and nothing is noted.
#[test]
fn sftp_flag_forces_sftp_for_host_path() {
    let (rsh, host) = need!(server());
    let d = tmpdir();
    let src = d.path().join("src");
    small_tree(&src);
    let dst = d.path().join("dst");
    let args = |sftp: bool| {
        let mut a: Vec<OsString> = vec!["copy".into()];
        if sftp {
            a.push("--sftp".into());
        }
        a.extend([
            "--remote-ferry".into(),
            "/nonexistent/ferry".into(),
            src.clone().into_os_string(),
            at(&host, dst.to_str().unwrap()),
        ]);
        a
    };
    let without = args(false);
    let r = run(
        &rsh,
        &without.iter().map(|s| s.as_os_str()).collect::<Vec<_>>(),
    );
    r.code_is(2);
    let with = args(true);
    let r = run(
        &rsh,
        &with.iter().map(|s| s.as_os_str()).collect::<Vec<_>>(),
    );
    r.ok();
    assert!(!r.err().contains("note"), "{r}");
    assert_trees_equal(&src, &dst);
}

// ------------------------------------------------------------------ errors

/// A missing root, a server that does not answer, a key it refuses: one
/// line each, exit 2, over sftp:// and over a fallback alike.
#[test]
fn errors_are_one_line_and_exit_2() {
    let (rsh, host) = need!(server());
    let d = tmpdir();
    let src = d.path().join("src");
    write(&src, "a", b"a");
    let dst = d.path().join("dst");
    let one_line = |r: &Run, want: &str| {
        r.code_is(2);
        let lines = r.error_lines();
        assert_eq!(lines.len(), 1, "{r}");
        assert!(lines[0].contains(want), "want {want:?}\n{r}");
    };
    let missing = d.path().join("nope/deeper");
    let r = run(
        &rsh,
        &["copy".as_ref(), &url(&host, &missing), dst.as_os_str()],
    );
    one_line(&r, "no such file or directory");
    let r = run(
        &rsh,
        &["copy".as_ref(), src.as_os_str(), &url(&host, &missing)],
    );
    one_line(&r, "no such directory");
    // A parent that is a file: said as such, nothing written.
    let r = run(
        &rsh,
        &[
            "copy".as_ref(),
            src.as_os_str(),
            &url(&host, &src.join("a").join("b")),
        ],
    );
    one_line(&r, "not a directory");
    assert_eq!(std::fs::read(src.join("a")).unwrap(), b"a");
    for (alias, want) in [
        ("ferry-test-down", "host unreachable"),
        ("ferry-test-badauth", "authentication failed"),
    ] {
        let r = run(&rsh, &["copy".as_ref(), src.as_os_str(), &url(alias, &dst)]);
        one_line(&r, want);
        let r = run(
            &rsh,
            &[
                "copy".as_ref(),
                "--no-remote-install".as_ref(),
                src.as_os_str(),
                &at(alias, dst.to_str().unwrap()),
            ],
        );
        one_line(&r, want);
        assert!(!r.err().contains("SFTP"), "{r}");
    }
}

// ------------------------------------------------------------------ refused files

/// Files the server refuses (a read-only directory in DST) among many
/// others in flight at once over several sessions: one error line per
/// refused file naming it, exit 1, every other file copied, no temporary
/// left; on the ordinary endpoint (behind the 20 ms proxy when
/// `FERRY_TEST_SSH_HOST` is its alias) and on the internal-sftp chroot.
#[test]
fn refused_files_fail_one_line_each_and_the_others_are_copied() {
    let (rsh, host) = need!(server());
    let d = tmpdir();
    let mut ends = vec![(host, d.path().join("dst"), None)];
    match chroot() {
        Ok((h, root, path)) => {
            let t = tempfile::tempdir_in(&root).unwrap();
            let there = format!("{path}/{}", t.path().file_name().unwrap().to_str().unwrap());
            ends.push((h, t.path().join("dst"), Some((t, there + "/dst"))));
        }
        Err(why) => eprintln!("chroot skipped: {why}"),
    }
    let src = d.path().join("src");
    for i in 0..300 {
        write(&src, format!("ok/f{i:03}"), &gen_bytes(4096, i));
        write(&src, format!("z{i:03}"), &gen_bytes(100 + i as usize, i));
    }
    for i in 0..24 {
        write(&src, format!("ro/r{i:02}"), &gen_bytes(4096, 1000 + i));
    }
    for rel in walk(&src).iter().rev() {
        set_mtime(&src.join(rel), (1_700_000_000, 0));
    }
    for (host, dst, chrooted) in ends {
        // DST's `ro` as SRC's (mode and mtime: nothing to set on it),
        // then refusing new entries.
        std::fs::create_dir_all(dst.join("ro")).unwrap();
        let ro = dst.join("ro");
        set_mtime(&ro, (1_700_000_000, 0));
        let guard = need!(ferry_conformance::local::read_only(&ro));
        let mode = std::fs::metadata(&ro).unwrap().permissions();
        std::fs::set_permissions(src.join("ro"), mode).unwrap();
        set_mtime(&src.join("ro"), (1_700_000_000, 0));
        let to = match &chrooted {
            Some((_, there)) => format!("sftp://{host}{there}").into(),
            None => url(&host, &dst),
        };
        let r = run(&rsh, &["copy".as_ref(), src.as_os_str(), &to]);
        r.code_is(1);
        // One line per refused file (and one for `ro` itself, whose
        // times the engine sets after writing in it, where it does).
        let mut lines = r.error_lines();
        lines.retain(|l| !l.starts_with("ferry: ro: "));
        lines.sort();
        assert_eq!(lines.len(), 24, "{r}");
        for (i, l) in lines.iter().enumerate() {
            assert!(l.starts_with(&format!("ferry: ro/r{i:02}: ")), "{l}\n{r}");
        }
        assert!(r.error_lines().len() <= 25, "{r}");
        for i in 0..300 {
            for f in [format!("ok/f{i:03}"), format!("z{i:03}")] {
                assert_trees_equal(&src.join(&f), &dst.join(&f));
            }
        }
        assert_eq!(std::fs::read_dir(&ro).unwrap().count(), 0);
        assert!(find_prefixed(&dst, b".ferry-").is_empty(), "{r}");
        drop(guard);
    }
}

// ------------------------------------------------------------------ kill -9

/// A big push killed (-9) part way: the rerun sends only what is missing
/// and completes; no temporary or partial is left.
#[test]
fn big_push_killed_then_rerun_resumes_and_leaves_nothing() {
    let (rsh, host) = need!(server());
    let d = tmpdir();
    let data = gen_bytes(200 << 20, 9);
    write(d.path(), "src/big", &data);
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    let mut child = std::process::Command::new(bin())
        .args([
            "copy".as_ref(),
            "-e".as_ref(),
            rsh.as_ref() as &OsStr,
            "--bwlimit".as_ref(),
            "20M".as_ref(),
            src.as_os_str(),
            &url(&host, &dst),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The partial's record is written after 128 MiB and 2 s, once the
    // partial's fsync is answered (created empty, then written in one
    // request): wait until there is one with its text (at 20 MB/s a few
    // seconds before the end).
    let mut waited = 0;
    let recorded = || {
        let parts = find_prefixed(&dst, b".ferry-part-");
        parts.len() >= 2
            && parts
                .iter()
                .all(|p| std::fs::metadata(dst.join(p)).is_ok_and(|m| m.len() > 0))
    };
    while !dst.exists() || !recorded() {
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
        assert!(waited < 1200, "no partial record appeared");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let r = run(
        &rsh,
        &[
            "copy".as_ref(),
            "-v".as_ref(),
            src.as_os_str(),
            &url(&host, &dst),
        ],
    );
    r.ok();
    assert!(std::fs::read(dst.join("big")).unwrap() == data);
    assert!(
        r.all().contains("upload(s) resumed"),
        "nothing resumed\n{r}"
    );
    assert!(find_prefixed(&dst, b".ferry-").is_empty());
}

/// How a test takes the SFTP servers of a run away.
enum Gone {
    /// Killed (-9).
    Killed,
    /// Stopped (SIGSTOP): a frozen server, given up after `--timeout 3`.
    Frozen,
}

/// The SFTP server killed (-9, every session of the run) in the middle of
/// a push of many small files, their commits pipelined: one line saying
/// the session was lost, exit 1 or 2, every file under its final name
/// whole (the others not there, or as temporaries); the rerun completes,
/// the destination equal to the source, nothing reserved left.
#[test]
fn sftp_server_killed_mid_push_then_rerun_completes() {
    sftp_server_gone_mid_push(Gone::Killed);
}

/// The SFTP server frozen (SIGSTOP, every session of the run) in the
/// middle of the same push: ferry does not wait for ever. After
/// `--timeout` it gives up with one line naming the host and the cause,
/// exit 1 or 2, every file under its final name whole; once the servers
/// are continued (and have left), a rerun completes.
#[test]
fn frozen_sftp_server_is_given_up_after_the_timeout_then_rerun_completes() {
    sftp_server_gone_mid_push(Gone::Frozen);
}

fn sftp_server_gone_mid_push(how: Gone) {
    let (rsh, host) = need!(server());
    let server_bin = Path::new("/usr/lib/openssh/sftp-server");
    if !server_bin.exists() {
        eprintln!("skipped: {} is missing", server_bin.display());
        return;
    }
    let d = tmpdir();
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    for i in 0..3000u64 {
        write(&src, format!("d{}/f{i:04}", i % 7), &gen_bytes(4096, i));
    }
    for rel in walk(&src).iter().rev() {
        set_mtime(&src.join(rel), (1_700_000_000, 0));
    }
    set_mtime(&src, (1_700_000_000, 0));
    // The -e command: the same ssh, running the standalone sftp-server
    // (what internal-sftp runs in sshd) whose pid it notes first.
    let pids = d.path().join("pids");
    let wrapper = d.path().join("rsh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/bash\n# -s [options] HOST sftp\nn=$(($# - 2))\nexec {rsh} \"${{@:2:$n}}\" \"echo \\$\\$ >> '{}'; exec {}\"\n",
            pids.display(),
            server_bin.display()
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
        wrapper.as_os_str(),
        "--bwlimit".as_ref(),
        "1M".as_ref(),
        src.as_os_str(),
        &url(&host, &dst),
    ])
    .stdin(std::process::Stdio::null());
    let push = std::thread::spawn(move || run_within(cmd, Duration::from_secs(300)));
    // Taken away once some files are there under their final names (not
    // only as temporaries: on a loaded machine the first commits may lag).
    let mut waited = 0;
    let count = |root: &Path| -> usize {
        let Ok(dirs) = std::fs::read_dir(root) else {
            return 0;
        };
        dirs.filter_map(|e| std::fs::read_dir(e.ok()?.path()).ok())
            .flatten()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| !e.file_name().as_bytes().starts_with(b".ferry-"))
            })
            .count()
    };
    while count(&dst) < 150 {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
        assert!(waited < 3000, "the push did not start");
    }
    let listed = std::fs::read_to_string(&pids).unwrap();
    let frozen = match how {
        Gone::Killed => {
            for pid in listed.split_whitespace() {
                let _ = std::process::Command::new("kill")
                    .args(["-9", pid])
                    .status();
            }
            None
        }
        Gone::Frozen => Some(crate::util::ssh::Frozen::stop(&listed)),
    };
    let r = push.join().unwrap();
    assert!(matches!(r.code, Some(1 | 2)), "{r}");
    let lines = r.error_lines();
    assert_eq!(lines.len(), 1, "{r}");
    let cause = match how {
        Gone::Killed => "SFTP session lost".to_string(),
        Gone::Frozen => {
            format!("{host}: SFTP session lost: no answer from the SFTP server for 3 s")
        }
    };
    assert!(lines[0].contains(&cause), "{r}");
    // Under a final name: whole, or not there.
    let mut there = 0;
    for rel in walk(&dst) {
        let p = dst.join(&rel);
        let name = rel.file_name().unwrap().as_bytes();
        if p.is_file() && !name.starts_with(b".ferry-") {
            assert_eq!(
                std::fs::read(&p).unwrap(),
                std::fs::read(src.join(&rel)).unwrap(),
                "{} half-written",
                rel.display()
            );
            there += 1;
        }
    }
    assert!(there > 0 && there < 3000, "{there} files copied\n{r}");
    eprintln!("{there} files copied before the server went\n{r}");
    if let Some(f) = frozen {
        f.thaw();
    }
    let r = run(&rsh, &["copy".as_ref(), src.as_os_str(), &url(&host, &dst)]);
    r.ok();
    assert_trees_equal(&src, &dst);
    assert!(find_prefixed(&dst, b".ferry-").is_empty(), "{r}");
}

/// Names with a newline, non-UTF-8 bytes, a leading dash and blanks go
/// both ways over SFTP byte for byte; a second run copies nothing.
#[test]
fn odd_names_pushed_and_pulled() {
    let (rsh, host) = need!(server());
    let d = tmpdir();
    let (src, there, back) = (
        d.path().join("src"),
        d.path().join("there"),
        d.path().join("back"),
    );
    // SFTP keeps whole seconds: so do these mtimes (directories last).
    let mut paths: Vec<PathBuf> = crate::util::ssh::odd_names_tree(&src)
        .iter()
        .map(|n| src.join(OsStr::from_bytes(n)))
        .collect();
    paths.extend([src.join(OsStr::from_bytes(b"dir\n\xff")), src.clone()]);
    for p in &paths {
        set_mtime(p, (1_700_000_000, 0));
    }
    for (from, to) in [
        (src.clone().into_os_string(), url(&host, &there)),
        (url(&host, &there), back.clone().into_os_string()),
    ] {
        for copies in [5, 0] {
            let r = run(&rsh, &["sync".as_ref(), "--json".as_ref(), &from, &to]);
            r.ok();
            assert_eq!(summary(&r).files_copied, copies, "{r}");
        }
    }
    assert_trees_equal(&src, &there);
    assert_trees_equal(&src, &back);
}

/// On the internal-sftp chroot `~` is the login directory the server
/// chose (the chroot's `/`: the user's home is not inside it), as
/// OpenSSH's sftp names it: `host:~/data/x` is `/data/x` there; `~user`
/// is that user's home (the server's `home-directory` answer), missing
/// in the chroot: one line, exit 2.
#[test]
fn tilde_is_the_login_directory_of_an_sftp_server() {
    let (rsh, _) = need!(server());
    let (host, local, remote) = need!(chroot());
    let d = tmpdir();
    let src = d.path().join("src");
    small_tree(&src);
    let there = tempfile::tempdir_in(&local).unwrap();
    let name = there.path().file_name().unwrap().to_str().unwrap();
    let rel = format!("{}/{name}/t", remote.trim_start_matches('/'));
    let dst = at(&host, &format!("~/{rel}"));
    run(&rsh, &["sync".as_ref(), src.as_os_str(), &dst]).ok();
    assert_trees_equal(&src, &there.path().join("t"));
    let back = d.path().join("back");
    run(&rsh, &["sync".as_ref(), &dst, back.as_os_str()]).ok();
    assert_trees_equal(&src, &back);
    let r = run(
        &rsh,
        &[
            "sync".as_ref(),
            src.as_os_str(),
            &at(&host, "~no-such-user-ferry/x"),
        ],
    );
    r.code_is(2);
    assert_eq!(r.error_lines().len(), 1, "{r}");
    assert!(r.err().contains("no such user"), "{r}");
}

/// What an SFTP destination cannot keep is said in SFTP's words: a fifo
/// skipped and `-X` with nothing kept name neither S3 nor an object
/// store, and a note is `ferry: note: ...` once (not `note: note:`).
#[test]
fn notes_on_an_sftp_destination_speak_of_sftp() {
    let (rsh, host) = need!(server());
    let d = tmpdir();
    let src = d.path().join("src");
    write(&src, "a", b"alpha");
    mkfifo(&src.join("fifo"));
    let dst = d.path().join("dst");
    let r = run(
        &rsh,
        &[
            "sync".as_ref(),
            "--sftp".as_ref(),
            "-X".as_ref(),
            src.as_os_str(),
            &url(&host, &dst),
        ],
    );
    r.ok();
    let err = r.err();
    assert!(err.contains("keeps none (SFTP keeps"), "{r}");
    assert!(err.contains("cannot store special files"), "{r}");
    for bad in ["S3", "object store", "note: note:"] {
        assert!(!err.contains(bad), "{bad:?}\n{r}");
    }
}

/// A server that offers `lsetstat@openssh.com` but refuses it (the real
/// sftp-server behind a relay that renames that request, so the server
/// answers it as unknown): the links are made, each run says so in one
/// note, and no link gets an error, a `meta` line or a failed count per
/// run (their time is left as made).
#[test]
fn lsetstat_offered_but_refused_is_one_note() {
    let Some((d, wrapper, host)) = lsetstat_refusing_server() else {
        return;
    };
    let (src, dst) = lsetstat_links(&d);
    for round in 0..2 {
        let r = ferry([
            "sync".as_ref(),
            "-v".as_ref(),
            "--json".as_ref(),
            "-e".as_ref(),
            wrapper.as_os_str(),
            src.as_os_str(),
            url(&host, &dst).as_os_str(),
        ]);
        r.ok();
        let notes = r
            .err()
            .matches("offers lsetstat@openssh.com but refused it")
            .count();
        assert_eq!(notes, 1, "round {round}\n{r}");
        assert_eq!(r.error_lines().len(), 1, "only the note\n{r}");
        assert_eq!(summary(&r).errors, 0, "{r}");
        let metas = actions(&r).into_iter().filter(|(t, _)| t == "meta").count();
        assert_eq!(metas, 0, "round {round}\n{r}");
        assert_eq!(std::fs::read_link(dst.join("l1")).unwrap(), Path::new("a"));
    }
}

/// The same server, asked by dry runs (`-n`) once the links are there:
/// each says once that the server refuses lsetstat, and lists no `meta`
/// for any link (on main: a `meta` line per link per dry run, since a
/// dry run never tried the server). The dry run's check writes nothing:
/// the links' times and change times are as they were.
#[test]
fn a_dry_run_against_a_server_refusing_lsetstat_says_it_once() {
    use std::os::unix::fs::MetadataExt;
    let Some((d, wrapper, host)) = lsetstat_refusing_server() else {
        return;
    };
    let (src, dst) = lsetstat_links(&d);
    let sync = |extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec!["sync".as_ref(), "-v".as_ref(), "--json".as_ref()];
        args.extend(extra.iter().map(OsStr::new));
        args.extend(["-e".as_ref(), wrapper.as_os_str(), src.as_os_str()]);
        let u = url(&host, &dst);
        args.push(u.as_os_str());
        let r = ferry(args);
        r.ok();
        r
    };
    sync(&[]);
    let times = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec())
    };
    let before = [times(&dst.join("l1")), times(&dst.join("l2"))];
    for round in 0..2 {
        let r = sync(&["-n"]);
        let notes = r
            .err()
            .matches("offers lsetstat@openssh.com but refused it")
            .count();
        assert_eq!(notes, 1, "dry run {round}\n{r}");
        assert_eq!(r.error_lines().len(), 1, "only the note\n{r}");
        assert_eq!(summary(&r).errors, 0, "{r}");
        let metas: Vec<_> = actions(&r)
            .into_iter()
            .filter(|(t, _)| t == "meta")
            .collect();
        assert!(metas.is_empty(), "dry run {round}: {metas:?}\n{r}");
        let after = [times(&dst.join("l1")), times(&dst.join("l2"))];
        assert_eq!(after, before, "a dry run changed a link");
    }
}

/// A server that offers `lsetstat@openssh.com` but refuses it: the real
/// sftp-server behind a relay that renames that request, so that the
/// server answers it as unknown. The scratch directory, the -e command
/// that reaches it, the host; `None` (said) where it cannot run.
fn lsetstat_refusing_server() -> Option<(tempfile::TempDir, PathBuf, String)> {
    let (rsh, host) = match server() {
        Ok(s) => s,
        Err(why) => {
            crate::util::skip(&why);
            return None;
        }
    };
    let server_bin = Path::new("/usr/lib/openssh/sftp-server");
    if !server_bin.exists() {
        crate::util::skip(&format!("{} is missing", server_bin.display()));
        return None;
    }
    let d = tmpdir();
    let relay = d.path().join("relay.py");
    std::fs::write(
        &relay,
        format!(
            r#"import subprocess, sys
p = subprocess.Popen(["{}"], stdin=subprocess.PIPE, stdout=sys.stdout.buffer)
inp = sys.stdin.buffer
def readn(n):
    b = b""
    while len(b) < n:
        c = inp.read(n - len(b))
        if not c:
            return None
        b += c
    return b
while True:
    h = readn(4)
    if h is None:
        break
    body = readn(int.from_bytes(h, "big"))
    if body is None:
        break
    p.stdin.write(h + body.replace(b"lsetstat@openssh.com", b"lsetstat@openssh.cox"))
    p.stdin.flush()
p.stdin.close()
p.wait()
"#,
            server_bin.display()
        ),
    )
    .unwrap();
    // The -e command: the same ssh, running the relay (`-s [options] HOST sftp`).
    let wrapper = d.path().join("rsh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/bash\nn=$(($# - 2))\nexec {rsh} \"${{@:2:$n}}\" \"exec python3 -u '{}'\"\n",
            relay.display()
        ),
    )
    .unwrap();
    chmod(&wrapper, 0o755);
    Some((d, wrapper, host))
}

/// SRC with a file and two links (one dangling) under `d`, and where DST
/// goes. The links are older than any DST copy can be (SFTP times are
/// whole seconds: a link made in the same second as its copy would compare
/// equal, and a second run would try no link time at all).
fn lsetstat_links(d: &tempfile::TempDir) -> (PathBuf, PathBuf) {
    let src = d.path().join("src");
    write(&src, "a", b"alpha");
    ln(&src, "l1", "a");
    ln(&src, "l2", "nowhere");
    set_mtime(&src.join("l1"), (1_600_000_000, 0));
    set_mtime(&src.join("l2"), (1_600_000_000, 0));
    (src, d.path().join("dst"))
}

/// The bytes a big upload's partial record under `dst` says arrived (the
/// sum of its ranges), once one is there with its whole text.
fn recorded_bytes(dst: &Path) -> Option<u64> {
    find_prefixed(dst, b".ferry-part-").iter().find_map(|p| {
        // Not the partial itself (read only the small one).
        if std::fs::metadata(dst.join(p)).ok()?.len() > 64 << 10 {
            return None;
        }
        let text = std::fs::read(dst.join(p)).ok()?;
        let text = std::str::from_utf8(text.strip_prefix(b"ferry sftp partial 1\n")?).ok()?;
        // The ident line, the ranges, the end line (a shorter rewrite
        // leaves an old tail after it, never read).
        let body = text.split_once('\n')?.1.split("end\n").next()?;
        if !text.contains("end\n") {
            return None;
        }
        body.lines()
            .map(|l| {
                let (a, b) = l.split_once('-')?;
                Some(b.parse::<u64>().ok()? - a.parse::<u64>().ok()?)
            })
            .sum()
    })
}

/// A big push killed once its first record is there resumes, and that
/// first record is written as soon as one 32 MiB range is done (it says
/// less than 128 MiB), not after 128 MiB and 2 s (a fast push killed
/// before its first record, most of the way, started over).
///
/// Flaky before (once, on a loaded machine): it pushed at full speed and
/// was killed when the partial held 112 MiB, counting on the first record
/// being there by then. The record follows the partial's fsync, which a
/// busy disk makes take seconds while the other session keeps writing:
/// killed before its record, the push rightly started over ("nothing
/// resumed"). Now the record itself is waited for and read (what the
/// promise is about), and `--bwlimit` leaves the fsync the rest of the
/// push to finish in.
#[test]
fn a_big_push_killed_early_resumes() {
    let (rsh, host) = need!(server());
    let d = tmpdir();
    let size = 256usize << 20;
    write(d.path(), "src/big", &gen_bytes(size, 19));
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    let mut child = std::process::Command::new(bin())
        .args([
            "copy".as_ref(),
            "-e".as_ref(),
            rsh.as_ref() as &OsStr,
            "--bwlimit".as_ref(),
            "16M".as_ref(),
            src.as_os_str(),
            &url(&host, &dst),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed as soon as its first record (with text) is there.
    let end = std::time::Instant::now() + Duration::from_secs(300);
    let first = loop {
        if let Some(n) = dst.exists().then(|| recorded_bytes(&dst)).flatten() {
            break n;
        }
        assert!(
            std::time::Instant::now() < end,
            "no partial record appeared"
        );
        if let Ok(Some(_)) = child.try_wait() {
            panic!("the push ended before its first record was written");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        first > 0 && first < 128 << 20,
        "the first record says {first} bytes"
    );
    let r = run(
        &rsh,
        &[
            "copy".as_ref(),
            "-v".as_ref(),
            src.as_os_str(),
            &url(&host, &dst),
        ],
    );
    r.ok();
    assert!(
        r.all().contains("upload(s) resumed"),
        "nothing resumed\n{r}"
    );
    assert!(std::fs::read(dst.join("big")).unwrap() == gen_bytes(size, 19));
    assert!(find_prefixed(&dst, b".ferry-").is_empty());
}

/// A push killed once its partial has a record, then its source changed
/// in place (same inode, size and mtime: what names it in the record):
/// the rerun resumes, checks the whole file at the end (the ranges sent
/// before read back and compared), sends again what differs, and the
/// file there is the new content, byte for byte.
#[test]
fn a_resumed_push_of_a_source_changed_in_place_is_checked_whole() {
    let (rsh, host) = need!(server());
    let d = tmpdir();
    let size = 128usize << 20;
    write(d.path(), "src/big", &gen_bytes(size, 23));
    let src = d.path().join("src");
    let big = src.join("big");
    let dst = d.path().join("dst");
    let mut child = std::process::Command::new(bin())
        .args([
            "copy".as_ref(),
            "-e".as_ref(),
            rsh.as_ref() as &OsStr,
            "--bwlimit".as_ref(),
            "16M".as_ref(),
            src.as_os_str(),
            &url(&host, &dst),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the partial and its record (with text) are there.
    let recorded = || {
        let parts = find_prefixed(&dst, b".ferry-part-");
        parts.len() >= 2
            && parts
                .iter()
                .all(|p| std::fs::metadata(dst.join(p)).is_ok_and(|m| m.len() > 0))
    };
    let mut waited = 0;
    while !dst.exists() || !recorded() {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
        assert!(waited < 6000, "no partial record appeared");
        if let Ok(Some(_)) = child.try_wait() {
            panic!("the push ended before its record was written");
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    use std::os::unix::fs::MetadataExt;
    let before = std::fs::metadata(&big).unwrap();
    let new = gen_bytes(size, 24);
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
    let r = run(
        &rsh,
        &[
            "copy".as_ref(),
            "-v".as_ref(),
            src.as_os_str(),
            &url(&host, &dst),
        ],
    );
    r.ok();
    assert!(
        r.all().contains("upload(s) resumed"),
        "nothing resumed\n{r}"
    );
    assert!(std::fs::read(dst.join("big")).unwrap() == new, "{r}");
    assert!(!r.all().contains(" 0 bytes sent again"), "{r}");
    assert!(find_prefixed(&dst, b".ferry-").is_empty());
}
