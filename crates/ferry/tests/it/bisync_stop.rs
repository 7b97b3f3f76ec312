//! bisync stopped by a signal, with and without `--watch`: the note comes at
//! once, no further entry is begun, the journal holds exactly what was done
//! (the next run completes, without a loss or a spurious conflict); a file
//! that vanishes before it is copied is a note, never an error or a record.
//!
//! No timing is asserted: a run is made long by `--bwlimit`, and ferry is
//! stopped (SIGSTOP) while the test changes what it must race.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::bisync_watch::{diff, records, snap};
use crate::util::watch::{Watch, WAIT};
use crate::util::*;

const NOTE: &str = "stopping after the entry in flight";

/// `n` files of 1,000 bytes in ten directories of `root`.
fn tree(root: &Path, n: usize) {
    for i in 0..n {
        write(root, format!("d{}/f{i:04}", i % 10), &[b'x'; 1000]);
    }
}

/// The files below `root`, relative (ferry's temporaries left out).
fn files(root: &Path) -> BTreeSet<PathBuf> {
    if !root.is_dir() {
        return BTreeSet::new();
    }
    walk(root)
        .into_iter()
        .filter(|p| root.join(p).is_file())
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .as_encoded_bytes()
                .starts_with(TMP_PREFIX)
        })
        .collect()
}

/// `ferry bisync [extra] --journal J A B`, running.
fn spawn(j: &Path, a: &Path, b: &Path, extra: &[&str]) -> Watch {
    let mut cmd = Command::new(bin());
    cmd.arg("bisync")
        .args(extra)
        .arg("--journal")
        .arg(j)
        .arg(a)
        .arg(b);
    if extra.contains(&"--json") {
        Watch::spawn_json(cmd)
    } else {
        Watch::spawn(cmd)
    }
}

/// Wait for the end of `w`: its exit code.
fn exit(w: &mut Watch) -> Option<i32> {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(s) = w.child.try_wait().unwrap() {
            return s.code();
        }
        assert!(Instant::now() < end, "still running:\n{}", w.stderr());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The file keys the journal holds (`d0/f0000` as `d0\0f0000`, shown with `/`).
fn recorded(j: &Path, a: &Path, b: &Path) -> BTreeSet<PathBuf> {
    records(j, a, b)
        .into_iter()
        .filter(|(_, s)| s.a.kind == ferry_engine::Kind::File)
        .map(|(k, _)| {
            let k: Vec<u8> = k.iter().map(|&c| if c == 0 { b'/' } else { c }).collect();
            PathBuf::from(String::from_utf8(k).unwrap())
        })
        .collect()
}

/// After a stopped run: B holds only whole files, fewer than A; the
/// journal records exactly B's files (as on both sides); a next run, after
/// a deletion on B of one file the stopped run copied, completes: the
/// deletion reaches A (it was recorded), nothing else is lost, no conflict.
fn check_after_stop(t: &Path, n: usize) {
    let (a, b, j) = (t.join("a"), t.join("b"), t.join("j"));
    let got = files(&b);
    assert!(got.len() < n, "the run went on to the end");
    for p in &got {
        assert_eq!(fs::read(b.join(p)).unwrap(), [b'x'; 1000], "{p:?}");
    }
    assert_eq!(recorded(&j, &a, &b), got, "the journal holds what was done");
    let gone = got.iter().next().expect("something copied").clone();
    fs::remove_file(b.join(&gone)).unwrap();
    let mut args: Vec<std::ffi::OsString> = vec!["bisync".into(), "--json".into()];
    args.extend(["--journal".into(), j.clone().into(), a.clone().into()]);
    args.push(b.clone().into());
    let r = ferry(&args);
    assert_eq!(r.code, Some(0), "{}", r.err());
    let s = summary(&r);
    assert_eq!(s["conflicts"], 0, "{s}");
    assert_eq!(s["files_deleted"], 1, "{s}");
    assert_eq!(
        s["files_copied"].as_u64(),
        Some((n - got.len()) as u64),
        "{s}"
    );
    assert!(!a.join(&gone).exists(), "the deletion on B reached A");
    assert_eq!(files(&a).len(), n - 1, "nothing else lost");
    let d = diff(&snap(&a), &snap(&b));
    assert!(d.is_empty(), "A and B differ:\n{}", d.join("\n"));
}

/// The summary line of a `--json` run.
fn summary(r: &Run) -> Json {
    r.out()
        .lines()
        .filter_map(|l| parse_json(l).ok())
        .find(|l| l["type"] == "summary")
        .unwrap_or_else(|| panic!("no summary:\n{}", r.out()))
}

/// SIGINT during a long bisync: the note at once, the run stops between
/// entries (exit 130, as a shell shows a process SIGINT ended), and the
/// journal lets the next run finish the job.
#[test]
fn a_signal_stops_bisync_between_entries_and_the_next_run_completes() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    let n = 3000;
    tree(&a, n);
    // 1,000-byte files at 100 KB/s: the run lasts 30 s at least.
    let mut w = spawn(&j, &a, &b, &["--bwlimit", "100K"]);
    w.until("the run copying", || !files(&b).is_empty());
    w.signal("INT");
    w.line_with(NOTE);
    assert_eq!(exit(&mut w), Some(130), "{}", w.stderr());
    assert!(w.stderr().contains("stopped by a signal"), "{}", w.stderr());
    check_after_stop(t.path(), n);
}

/// The same with `--watch`, stopped by SIGTERM during its first run: exit
/// 0 (nothing failed).
#[test]
fn a_signal_stops_a_bisync_watch_run_between_entries() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    let n = 3000;
    tree(&a, n);
    let mut w = spawn(&j, &a, &b, &["--watch", "--bwlimit", "100K"]);
    w.until("the first run copying", || !files(&b).is_empty());
    w.signal("TERM");
    w.line_with(NOTE);
    assert_eq!(exit(&mut w), Some(0), "{}", w.stderr());
    check_after_stop(t.path(), n);
}

/// `bisync --watch` with a path failing (an immutable file on B): SIGTERM
/// exits 1, not 0.
#[test]
fn a_signal_while_a_bisync_watch_path_fails_exits_1() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    write(&a, "f1", b"one");
    write(&a, "f2", b"two");
    let mut w = spawn(&j, &a, &b, &["--watch"]);
    w.until("B has f2", || {
        fs::read(b.join("f2")).is_ok_and(|x| x == b"two")
    });
    let Some(_imm) = Immutable::try_set(&b.join("f2")) else {
        skip(&"chattr +i does not work here");
        return;
    };
    fs::write(a.join("f2"), b"two, edited").unwrap();
    w.line_with("f2: ");
    let (code, err) = w.stop();
    assert_eq!(code, Some(1), "a path still failing at SIGTERM:\n{err}");
}

/// Lines of `err` that are errors naming `path` (not notes or skips).
fn error_lines(err: &str, path: &str) -> Vec<String> {
    err.lines()
        .filter(|l| l.starts_with("ferry: ") && !l.starts_with("ferry: note:"))
        .filter(|l| !l.starts_with("ferry: skipped "))
        .filter(|l| l.contains(path))
        .map(str::to_string)
        .collect()
}

/// A run of 1,000 files at 100 KB/s stopped (SIGSTOP) once it copies; the
/// last file removed from A meanwhile; then let go on.
fn vanish_during(w: &mut Watch, a: &Path, b: &Path, last: &str) {
    w.until("the run copying", || !files(b).is_empty());
    w.signal("STOP");
    assert!(!b.join(last).exists(), "the run got to {last} already");
    fs::remove_file(a.join(last)).unwrap();
    w.signal("CONT");
}

/// A file removed from A before bisync copies it: a note ("vanished"),
/// no error, exit 0, no journal record of it; the next run has nothing
/// to do.
#[test]
fn a_file_that_vanishes_before_bisync_copies_it_is_a_note() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    let n = 1000;
    tree(&a, n);
    let last = format!("d{}/f{:04}", (n - 1) % 10, n - 1);
    let mut w = spawn(&j, &a, &b, &["--bwlimit", "100K"]);
    vanish_during(&mut w, &a, &b, &last);
    assert_eq!(exit(&mut w), Some(0), "{}", w.stderr());
    let err = w.stderr();
    assert_eq!(error_lines(&err, &last), Vec::<String>::new(), "{err}");
    assert!(
        err.contains(&format!("skipped A {last}: vanished")),
        "said as a note:\n{err}"
    );
    assert!(!recorded(&j, &a, &b).contains(Path::new(&last)));
    let d = diff(&snap(&a), &snap(&b));
    assert!(d.is_empty(), "A and B differ:\n{}", d.join("\n"));
    let r = ferry([
        "bisync".as_ref(),
        "--json".as_ref(),
        "--journal".as_ref(),
        j.as_os_str(),
        a.as_os_str(),
        b.as_os_str(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.err());
    let s = summary(&r);
    assert_eq!(
        (s["files_copied"].as_u64(), s["files_deleted"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
}

/// The same in `bisync --watch`: no error, and no full run follows (every
/// run after the first is scoped).
#[test]
fn a_file_that_vanishes_in_a_bisync_watch_is_a_note_and_no_full_run() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    let n = 1000;
    tree(&a, n);
    let last = format!("d{}/f{:04}", (n - 1) % 10, n - 1);
    // B there from the start (a root made by the first run is a root
    // back, which sets a full run of its own).
    fs::create_dir_all(&b).unwrap();
    let mut w = spawn(&j, &a, &b, &["--watch", "--json", "--bwlimit", "100K"]);
    vanish_during(&mut w, &a, &b, &last);
    let first = w.summary();
    assert_eq!(first["scoped"], 0, "{first}");
    assert_eq!(first["errors"], 0, "{first}");
    // A marker change after the first run: once B has it, every run
    // the removal caused has come and gone.
    write(&a, "marker", b"m");
    w.until("B has the marker", || b.join("marker").exists());
    let d = diff(&snap(&a), &snap(&b));
    assert!(d.is_empty(), "A and B differ:\n{}", d.join("\n"));
    let end = Instant::now() + WAIT;
    let mut later = Vec::new();
    while !later.iter().any(|s: &Json| s["files_copied"] == 1) {
        later.extend(w.summaries());
        assert!(Instant::now() < end, "no run copied the marker: {later:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for s in &later {
        assert_eq!(s["scoped"], 1, "a full run followed: {s}");
        assert_eq!(s["errors"], 0, "{s}");
    }
    let err = w.stop_ok();
    assert_eq!(error_lines(&err, &last), Vec::<String>::new(), "{err}");
    assert!(
        err.contains(&format!("skipped A {last}: vanished")),
        "said as a note:\n{err}"
    );
    assert!(!recorded(&j, &a, &b).contains(Path::new(&last)));
}

/// SIGINT while bisync resolves conflicts (every loser is moved aside
/// first, then the copies go at 100 KB/s): nothing is lost, and the next
/// run completes them with no new conflict: each path ends with both
/// versions on both sides, once each. (Flaky once under load: the run saw
/// the signal's flag, ended and exited before the signal thread said its
/// note; the flag is now set after the note: `signals::tests`.)
#[test]
fn a_signal_during_conflicts_loses_nothing_and_makes_no_new_conflict() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    let n = 1000;
    tree(&a, n);
    let args = |extra: &[&str]| {
        let mut v: Vec<std::ffi::OsString> = vec!["bisync".into(), "--json".into()];
        v.extend(extra.iter().map(Into::into));
        v.extend([
            "--journal".into(),
            j.clone().into(),
            a.clone().into(),
            b.clone().into(),
        ]);
        v
    };
    assert_eq!(ferry(args(&[])).code, Some(0));
    // Both sides change every file: a conflict each.
    let body = |side: &str, i: usize| format!("{side} {i:04} {}", "x".repeat(990)).into_bytes();
    for i in 0..n {
        let rel = format!("d{}/f{i:04}", i % 10);
        fs::write(a.join(&rel), body("A", i)).unwrap();
        fs::write(b.join(&rel), body("B", i)).unwrap();
    }
    let mut w = spawn(&j, &a, &b, &["--bwlimit", "100K", "--json"]);
    let conflicted = |root: &Path| {
        files(root)
            .iter()
            .any(|p| p.to_string_lossy().contains("(conflict "))
    };
    w.until("a conflict copy made", || conflicted(&a) || conflicted(&b));
    w.signal("INT");
    w.line_with(NOTE);
    assert_eq!(exit(&mut w), Some(130), "{}", w.stderr());
    // The signal may land before every loser was moved aside (a loaded machine): those
    // paths are still conflicts for the next run, but no path is a conflict twice.
    let first = w.summary();
    let r = ferry(args(&[]));
    assert_eq!(r.code, Some(0), "{}", r.err());
    let s = summary(&r);
    let twice = first["conflicts"].as_u64().unwrap() + s["conflicts"].as_u64().unwrap();
    assert_eq!(
        twice, n as u64,
        "each path a conflict once: {first} then {s}"
    );
    let d = diff(&snap(&a), &snap(&b));
    assert!(d.is_empty(), "A and B differ:\n{}", d.join("\n"));
    let all = files(&a);
    assert_eq!(all.len(), 2 * n, "one conflict copy per path");
    for i in 0..n {
        let dir = a.join(format!("d{}", i % 10));
        let name = format!("f{i:04}");
        let mut got: Vec<Vec<u8>> = all
            .iter()
            .filter(|p| p.parent() == Some(Path::new(&format!("d{}", i % 10))))
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&name))
            .map(|p| fs::read(a.join(p)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, vec![body("A", i), body("B", i)], "{}", dir.display());
    }
}
