//! Hostile tests: ssh_install (see main.rs). Against the real OpenSSH server of
//! `scripts/sshd` (`FERRY_TEST_SSH_*`): concurrent first runs racing the self-install, a
//! planted (tampered) cached binary, a host where ferry cannot run with flags only ferry
//! keeps, and connections killed mid-run (ssh and SFTP). The remote host is this machine:
//! remote trees are checked on disk, and each test gives the remote shell a HOME of its own
//! (its cache), never the real one.
//!
//! Unlike the -e wrapper of tests/ssh.rs, the one here passes SFTP subsystem requests
//! through unchanged, so SFTP works: a run that falls back to SFTP does so here as it would
//! for a user (that wrapper broke SFTP, which hid the silent fallback).
#[allow(unused_imports)]
use crate::util::*;

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::ssh::{ssh_at as at, ssh_server};

/// An -e command: the test server's ssh, with the remote command run under `HOME=home`
/// and a PATH without ferry (no XDG_CACHE_HOME: the cache is `home/.cache/ferry`); an SFTP
/// subsystem request goes through as it is. Each ssh it starts appends its pid to
/// `dir/pids`.
fn rsh_home(rsh: &str, dir: &Path, home: &Path) -> String {
    let script = dir.join("rsh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\necho $$ >> '{pids}'\nfor a in \"$@\"; do [ \"$a\" = -s ] && exec {rsh} \"$@\"; done\nlast=\"${{@: -1}}\"\nset -- \"${{@:1:$#-1}}\"\nexec {rsh} \"$@\" \"unset XDG_CACHE_HOME; export HOME='{home}' PATH=/usr/bin:/bin; $last\"\n",
            pids = dir.join("pids").display(),
            home = home.display(),
        ),
    )
    .unwrap();
    chmod(&script, 0o755);
    script.to_string_lossy().into_owned()
}

/// The files of the remote cache directory under `home`, but the markers an install
/// writes beside a cached ferry (`NAME.ok`).
fn cache_files(home: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(home.join(".cache/ferry")) {
        Ok(d) => d
            .map(|e| e.unwrap().path())
            .filter(|p| !p.to_string_lossy().ends_with(".ok"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn xattr(p: &Path) -> Option<Vec<u8>> {
    let mut v = vec![0u8; 4096];
    rustix::fs::lgetxattr(p, "user.ferry", &mut v[..])
        .ok()
        .map(|n| v[..n].to_vec())
}

/// A tree with what only ferry on the remote keeps: two names of one file (`-H`), an
/// extended attribute (`-X`), a fifo, nanosecond mtimes.
fn rich_tree(src: &Path) {
    write(src, "a/one", &gen_bytes(70_000, 1));
    std::fs::hard_link(src.join("a/one"), src.join("a/two")).unwrap();
    write(src, "b/attr", b"with an attribute");
    rustix::fs::lsetxattr(
        src.join("b/attr"),
        "user.ferry",
        b"kept",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    mkfifo(&src.join("b/fifo"));
    for i in 0..20 {
        write(src, format!("c/f{i}"), &gen_bytes(1000 + i, i as u64));
    }
    stamp_tree(src, 1_600_000_000);
}

/// Everything of `rich_tree` is in `dst`, as in `src`.
#[track_caller]
fn assert_all_kept(src: &Path, dst: &Path, r: &Run) {
    let diffs = tree_diffs(src, dst);
    assert!(diffs.is_empty(), "{diffs:?}\n{r}");
    let (m1, m2) = (
        std::fs::metadata(dst.join("a/one")).unwrap(),
        std::fs::metadata(dst.join("a/two")).unwrap(),
    );
    assert_eq!(m1.ino(), m2.ino(), "-H: one file in DST\n{r}");
    assert_eq!(
        xattr(&dst.join("b/attr")).as_deref(),
        Some(&b"kept"[..]),
        "-X\n{r}"
    );
}

/// Four first runs at once, on a host without ferry and an empty cache, with `-H -X` and
/// a fifo in SRC: they race to install ferry there. Each run either keeps everything (exit
/// 0) or stops with one line (exit 2); none goes over SFTP without what it was asked to
/// keep. Once ferry is there, one file is in the cache, no temporary. (Before: the losers'
/// link failed, and they fell back to SFTP with a note, exit 0, hard links, attribute,
/// fifo and nanoseconds dropped.) Two rounds, each with a fresh cache.
#[test]
fn first_runs_at_once_wait_out_the_install_race() {
    let (rsh, host) = need!(ssh_server());
    for round in 0..2 {
        let d = tmpdir();
        let home = d.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let rsh = rsh_home(&rsh, d.path(), &home);
        let src = d.path().join("src");
        rich_tree(&src);
        let runs: Vec<_> = (0..4)
            .map(|i| {
                let a: Vec<OsString> = vec![
                    "copy".into(),
                    "-H".into(),
                    "-X".into(),
                    "-e".into(),
                    rsh.clone().into(),
                    src.clone().into(),
                    at(&host, &d.path().join(format!("dst{i}"))),
                ];
                std::thread::spawn(move || ferry(&a))
            })
            .collect();
        let runs: Vec<Run> = runs.into_iter().map(|t| t.join().unwrap()).collect();
        let codes: Vec<_> = runs.iter().map(|r| r.code).collect();
        eprintln!("round {round}: exit codes {codes:?}");
        let mut done = 0;
        for (i, r) in runs.iter().enumerate() {
            assert!(!r.err().contains("using SFTP"), "round {round}: {r}");
            match r.code {
                Some(0) => {
                    assert_all_kept(&src, &d.path().join(format!("dst{i}")), r);
                    done += 1;
                }
                Some(2) => assert_eq!(r.error_lines().len(), 1, "round {round}: {r}"),
                _ => panic!("round {round}: neither done nor refused: {r}"),
            }
        }
        assert!(done >= 1, "round {round}: no run got through");
        let installed = runs
            .iter()
            .filter(|r| r.err().contains("installed this ferry"))
            .count();
        assert_eq!(installed, 1, "round {round}: one link wins");
        let files = cache_files(&home);
        assert_eq!(files.len(), 1, "one file, no temporaries: {files:?}");
        assert_eq!(
            std::fs::read(&files[0]).unwrap(),
            crate::util::ssh::shipped_bin()
        );
    }
}

/// The first run killed while it uploads ferry to the host (kill -9 of this ferry, so its
/// ssh's input ends mid-file): nothing half-uploaded is left in the cache (the remote
/// step removes its temporary), nothing is ever run from it, and the next run installs
/// and keeps everything.
#[test]
fn a_first_run_killed_mid_install_leaves_no_temporary_and_the_rerun_installs() {
    let (rsh, host) = need!(ssh_server());
    let d = tmpdir();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let rsh = rsh_home(&rsh, d.path(), &home);
    let src = d.path().join("src");
    rich_tree(&src);
    let dst = d.path().join("dst");
    let args: Vec<OsString> = vec![
        "copy".into(),
        "-H".into(),
        "-X".into(),
        "-e".into(),
        rsh.clone().into(),
        src.clone().into(),
        at(&host, &dst),
    ];
    let mut child = std::process::Command::new(bin())
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once its upload has begun: a temporary there with some of the bytes.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let partial = cache_files(&home)
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0));
        if partial {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no upload began: {:?}",
            child.try_wait()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The remote step sees its input end and removes its temporary.
    let whole = crate::util::ssh::shipped_bin();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let files = cache_files(&home);
        // Only a final name may stay (when the upload was through before the kill), whole.
        if files.iter().all(|p| {
            !p.file_name().unwrap().to_string_lossy().starts_with('.')
                && std::fs::read(p).unwrap() == whole
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a temporary stays: {files:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = ferry(&args);
    r.ok();
    assert_all_kept(&src, &dst, &r);
    assert_eq!(cache_files(&home).len(), 1, "{:?}", cache_files(&home));
}

/// The install's ssh killed mid-upload (the connection lost while ferry is being put on
/// the host): the run is not taken for one on a host where ferry cannot run, so it does
/// not go over SFTP without the fifo and the nanoseconds: exit 2, one line, nothing done;
/// the rerun installs and keeps everything. (Before: the SFTP fallback, exit 0, the fifo
/// skipped and the mtimes cut to the second.)
#[test]
fn an_install_cut_by_a_lost_connection_stops_rather_than_fall_back() {
    let (rsh, host) = need!(ssh_server());
    let d = tmpdir();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let rsh = rsh_home(&rsh, d.path(), &home);
    let src = d.path().join("src");
    rich_tree(&src);
    let dst = d.path().join("dst");
    let args: Vec<OsString> = vec![
        "copy".into(),
        "-e".into(),
        rsh.clone().into(),
        src.clone().into(),
        at(&host, &dst),
    ];
    let mut cmd = std::process::Command::new(bin());
    cmd.args(&args).stdin(std::process::Stdio::null());
    let run = std::thread::spawn(move || run_within(cmd, Duration::from_secs(300)));
    // Once the upload has begun (a temporary with some bytes), its ssh is killed.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !cache_files(&home)
        .iter()
        .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
    {
        assert!(std::time::Instant::now() < deadline, "no upload began");
        std::thread::sleep(Duration::from_millis(5));
    }
    kill_ssh(d.path());
    let r = run.join().unwrap();
    eprintln!("the run cut: exit {:?}: {}", r.code, r.err().trim());
    assert!(!r.err().contains("using SFTP"), "{r}");
    match r.code {
        // The upload was through before the kill: everything kept (fifo, nanoseconds).
        Some(0) => assert_eq!(tree_diffs(&src, &dst), Vec::<String>::new(), "{r}"),
        Some(2) => {
            assert_eq!(r.error_lines().len(), 1, "{r}");
            assert!(r.err().contains("ssh failed"), "{r}");
            assert!(!dst.exists(), "nothing done: {r}");
        }
        _ => panic!("neither done nor refused: {r}"),
    }
    let r = ferry(&args);
    r.ok();
    assert_eq!(tree_diffs(&src, &dst), Vec::<String>::new(), "{r}");
}

/// A cached binary tampered with (same name, other bytes; still an executable): never run,
/// never replaced, and no SFTP in its place: one line `HOST: PATH is not this ferry (...)`,
/// exit 2, DST untouched. (Before: with SFTP working, the run went on over SFTP with a
/// note, exit 0.)
#[test]
fn a_tampered_cached_binary_stops_the_run_with_one_line() {
    let (rsh, host) = need!(ssh_server());
    let d = tmpdir();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let rsh = rsh_home(&rsh, d.path(), &home);
    write(d.path(), "src/a", b"first");
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
    copy().ok();
    let files = cache_files(&home);
    assert_eq!(files.len(), 1, "{files:?}");
    let cached = &files[0];
    // Made anew (the last run's remote ferry may still run from the old file): the same
    // binary with one byte changed at its end.
    let mut bytes = std::fs::read(cached).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::remove_file(cached).unwrap();
    std::fs::write(cached, &bytes).unwrap();
    chmod(cached, 0o755);
    write(d.path(), "src/b", b"second");
    let before = snapshot(&dst);
    let r = copy();
    r.code_is(2);
    let lines = r.error_lines();
    assert_eq!(lines.len(), 1, "{r}");
    assert!(
        lines[0].contains(&format!("{} is not this ferry", cached.display())),
        "{r}"
    );
    assert!(lines[0].contains("--remote-ferry PATH"), "{r}");
    assert!(!r.err().contains("SFTP"), "{r}");
    assert_eq!(std::fs::read(cached).unwrap(), bytes, "not replaced");
    assert_untouched(&before, &snapshot(&dst));
    // (A file planted between a run's probe and its link gets the same line: the install
    // step answers with its hash; ferry-ssh's unit test of that step covers it.)
}

/// A host where ferry cannot run (`--no-remote-install`, no ferry there) with `-X` (or
/// `-H`, `-A`) asked: SFTP would drop it, so the run stops with one line, exit 2, nothing
/// done. Without those flags the same host is served over SFTP with one note, as before.
#[test]
fn no_fallback_to_sftp_that_drops_what_was_asked() {
    let (rsh, host) = need!(ssh_server());
    let d = tmpdir();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let rsh = rsh_home(&rsh, d.path(), &home);
    let src = d.path().join("src");
    rich_tree(&src);
    let dst = d.path().join("dst");
    let copy = |flags: &[&str]| {
        let mut a: Vec<OsString> = vec![
            "copy".into(),
            "--no-remote-install".into(),
            "-e".into(),
            rsh.clone().into(),
        ];
        a.extend(flags.iter().map(OsString::from));
        a.push(src.clone().into());
        a.push(at(&host, &dst));
        ferry(&a)
    };
    for flags in [&["-X"][..], &["-H"], &["-A", "-X"]] {
        let r = copy(flags);
        r.code_is(2);
        let lines = r.error_lines();
        assert_eq!(lines.len(), 1, "{r}");
        assert!(lines[0].contains("ferry cannot run there"), "{r}");
        assert!(lines[0].contains("would be lost"), "{r}");
        for f in flags {
            assert!(lines[0].contains(&format!("{f} (")), "{f}: {r}");
        }
        assert!(
            lines[0].contains("no ferry on the remote"),
            "the cause: {r}"
        );
        assert!(!dst.exists(), "nothing done: {r}");
        assert!(cache_files(&home).is_empty(), "{r}");
    }
    // bisync the same (-X, -A).
    let r = ferry([
        "bisync".as_ref(),
        "--no-remote-install".as_ref(),
        "-A".as_ref(),
        "-e".as_ref(),
        rsh.as_ref() as &std::ffi::OsStr,
        "--journal".as_ref(),
        d.path().join("j.db").as_os_str(),
        src.as_os_str(),
        &at(&host, &dst),
    ]);
    r.code_is(2);
    assert_eq!(r.error_lines().len(), 1, "{r}");
    assert!(r.err().contains("-A (ACLs) would be lost"), "{r}");
    assert!(!dst.exists(), "nothing done: {r}");
    // Nothing asked that SFTP cannot keep: SFTP, said once.
    let r = copy(&[]);
    r.ok();
    assert!(r.err().contains("using SFTP"), "{r}");
    assert_eq!(
        std::fs::read(dst.join("c/f3")).unwrap(),
        gen_bytes(1003, 3),
        "{r}"
    );
}

/// Kill every ssh a run started (the pids its -e wrapper wrote) once `dst` holds `n`
/// entries, then wait for the run.
fn kill_mid_run(cmd: std::process::Command, dir: &Path, dst: &Path, n: usize) -> Run {
    let run = std::thread::spawn(move || run_within(cmd, Duration::from_secs(300)));
    let count = |p: &Path| walk(p).len();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !(dst.exists() && count(dst) >= n) {
        assert!(
            std::time::Instant::now() < deadline,
            "the run did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_ssh(dir);
    run.join().unwrap()
}

/// Kill every ssh the -e wrapper in `dir` started that still runs.
fn kill_ssh(dir: &Path) {
    // Only pids that are still this run's ssh (an ssh that ended may have left its pid to
    // another process).
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap();
    let rsh = dir.join("rsh");
    for p in pids.split_whitespace() {
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("ssh") && !cmdline.contains(rsh.to_str().unwrap()) {
            let _ = std::process::Command::new("kill").args(["-9", p]).status();
        }
    }
}

/// The one line of a run stopped by a lost connection: no count (the scan was cut short,
/// so the run cannot know what is left; before, "stopped, N entries left undone" counted
/// only what it had reached: 618 said, 17,160 copied by the rerun), and a rerun finishes.
#[track_caller]
fn assert_stopped_line(r: &Run, cause: &str) {
    assert_eq!(r.code, Some(1), "{r}");
    let lines = r.error_lines();
    assert_eq!(lines.len(), 1, "{r}");
    assert!(lines[0].contains(cause), "{r}");
    assert!(lines[0].ends_with("; stopped; rerun to finish"), "{r}");
    assert!(!r.err().contains("left undone"), "{r}");
    // The cause whole (it was cut at its first " (os error", a parenthesis left open).
    assert_eq!(
        lines[0].matches('(').count(),
        lines[0].matches(')').count(),
        "{r}"
    );
}

/// A tree of many small files in many directories (the scan takes a while).
fn many_files(src: &Path) {
    for i in 0..2000 {
        write(src, format!("d{:02}/f{i:04}", i % 40), &gen_bytes(3000, i));
    }
}

/// ssh killed mid-push (ferry on both ends), the scan of SRC not done: one line, no count;
/// the rerun completes.
#[test]
fn a_lost_ssh_connection_says_stopped_without_a_count() {
    let (rsh, host) = need!(ssh_server());
    let d = tmpdir();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let rsh = rsh_home(&rsh, d.path(), &home);
    let src = d.path().join("src");
    many_files(&src);
    let dst = d.path().join("dst");
    let mut cmd = std::process::Command::new(bin());
    cmd.args([
        "copy",
        "-j",
        "2",
        "--bwlimit",
        "500K",
        "-e",
        &rsh,
        "--remote-ferry",
    ])
    .arg(bin())
    .arg(&src)
    .arg(at(&host, &dst))
    .stdin(std::process::Stdio::null());
    let r = kill_mid_run(cmd, d.path(), &dst, 20);
    assert_stopped_line(&r, "connection lost");
    ferry([
        "copy".as_ref(),
        "-e".as_ref(),
        rsh.as_ref() as &std::ffi::OsStr,
        "--remote-ferry".as_ref(),
        bin().as_os_str(),
        src.as_os_str(),
        &at(&host, &dst),
    ])
    .ok();
    assert_trees_equal(&src, &dst);
}

/// The same over SFTP (`--sftp`), pulling: the SFTP session's ssh killed mid-run.
#[test]
fn a_lost_sftp_session_says_stopped_without_a_count() {
    let (rsh, host) = need!(ssh_server());
    let d = tmpdir();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let rsh = rsh_home(&rsh, d.path(), &home);
    let src = d.path().join("src");
    many_files(&src);
    // Whole seconds: SFTP keeps no more.
    for p in walk(&src) {
        set_mtime(&src.join(&p), (1_600_000_000, 0));
    }
    set_mtime(&src, (1_600_000_000, 0));
    let dst = d.path().join("dst");
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["copy", "--sftp", "-j", "2", "--bwlimit", "500K", "-e", &rsh])
        .arg(at(&host, &src))
        .arg(&dst)
        .stdin(std::process::Stdio::null());
    let r = kill_mid_run(cmd, d.path(), &dst, 20);
    assert_stopped_line(&r, "lost");
    ferry([
        "copy".as_ref(),
        "--sftp".as_ref(),
        "-e".as_ref(),
        rsh.as_ref() as &std::ffi::OsStr,
        &at(&host, &src),
        dst.as_os_str(),
    ])
    .ok();
    assert_trees_equal(&src, &dst);
}
