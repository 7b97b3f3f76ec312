//! A watch left running heals itself: a failing path is retried with
//! backoff and said once (then once more when it heals), a periodic rescan
//! corrects what no event told, a signal stops a long run between entries,
//! and the exit code tells whether something is still failing.

use std::fs;
use std::process::Command;
use std::time::Instant;

use crate::util::watch::{converge, Watch, WAIT};
use crate::util::*;

/// Stderr lines naming `path` as failed (`ferry: ...PATH...: cause`, not
/// notes).
fn error_lines(err: &str, path: &str) -> usize {
    err.lines()
        .filter(|l| l.starts_with("ferry: ") && !l.starts_with("ferry: note:"))
        .filter(|l| !l.starts_with("ferry: skipped "))
        .filter(|l| l.contains(path))
        .count()
}

/// `sync --watch` into a file made immutable: the copy fails, is said
/// once, retried with no other change, and healed once the cause is gone;
/// a SIGTERM while it fails exits 1, after it healed 0.
#[test]
fn sync_retries_a_failing_path_until_it_heals() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "f1", b"one");
    write(&src, "f2", b"two");
    let mut w = Watch::start(&["sync"], &src, &dst);
    converge(&src, &dst, &mut w);
    let Some(imm) = Immutable::try_set(&dst.join("f2")) else {
        skip(&"chattr +i does not work here");
        return;
    };
    fs::write(src.join("f2"), b"two, edited").unwrap();
    w.line_with("f2: ");
    // Still failing: SIGTERM says so with exit 1.
    let (code, err) = w.stop();
    assert_eq!(code, Some(1), "a path still failing at SIGTERM:\n{err}");
    assert_eq!(error_lines(&err, "f2"), 1, "said once:\n{err}");

    // Again, and the cause removed: DST heals with no other change.
    let mut w = Watch::start(&["sync"], &src, &dst);
    w.line_with("f2: ");
    drop(imm);
    w.until("DST/f2 healed", || {
        fs::read(dst.join("f2")).is_ok_and(|b| b == b"two, edited")
    });
    w.line_with("f2: healed");
    let err = w.stop_ok();
    assert_eq!(error_lines(&err, "f2"), 1, "said once:\n{err}");
}

/// `bisync --watch` into a file made immutable on B: no run per event its
/// own attempts make (it spun at hundreds of runs a second), the error is
/// said once over several retries, and B heals once the cause is gone.
#[test]
fn bisync_does_not_spin_on_a_failing_path_and_heals() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write(&a, "f1", b"one");
    write(&a, "f2", b"two");
    fs::create_dir_all(&b).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["bisync", "--json", "--watch"]).arg(&a).arg(&b);
    let mut w = Watch::spawn_json(cmd);
    // The first run's end (B has f2 before its summary comes: on a loaded machine the
    // summary could come after what follows and be counted below).
    let first = w.summary();
    assert_eq!(first["files_copied"], 2, "{}", w.stderr());
    let Some(imm) = Immutable::try_set(&b.join("f2")) else {
        skip(&"chattr +i does not work here");
        return;
    };
    w.summaries();
    let since = Instant::now();
    fs::write(a.join("f2"), b"two, edited").unwrap();
    // Three runs that failed on f2: the one of the change, two retries.
    let mut failed = 0;
    let mut runs = 0;
    while failed < 3 {
        let s = w.summary();
        runs += 1;
        if s["errors"].as_u64() == Some(1) {
            failed += 1;
        }
    }
    let secs = since.elapsed().as_secs();
    // Retries 1 s, 2 s apart at least (3/4 of it with jitter): a spin
    // makes a run every settle time (100 ms). One run more may come of
    // `chattr` itself (B's f2 changed its ctime), before the write or with it.
    assert!(
        runs <= 4 + secs as usize,
        "{runs} runs in {secs} s:\n{}",
        w.stderr()
    );
    let err = w.stderr();
    assert_eq!(error_lines(&err, "f2"), 1, "said once:\n{err}");
    drop(imm);
    w.until("B/f2 healed", || {
        fs::read(b.join("f2")).is_ok_and(|x| x == b"two, edited")
    });
    w.line_with("f2: healed");
    let err = w.stop_ok();
    assert_eq!(error_lines(&err, "f2"), 1, "said once:\n{err}");
}

/// An edit made directly in DST (no event: DST is not watched) is
/// corrected by the periodic rescan; `--rescan off` parses.
#[test]
fn a_rescan_corrects_an_edit_made_in_dst() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "d/f", b"the source's");
    let mut w = Watch::start(&["sync", "--rescan", "1s"], &src, &dst);
    converge(&src, &dst, &mut w);
    fs::write(dst.join("d/f"), b"drift").unwrap();
    w.until("DST/d/f corrected", || {
        fs::read(dst.join("d/f")).is_ok_and(|b| b == b"the source's")
    });
    w.stop_ok();
    for off in ["off", "0"] {
        let mut w = Watch::start(&["sync", "--rescan", off], &src, &dst);
        w.until_inotify();
        w.stop_ok();
    }
}

/// SIGINT during a long first run: the note comes, the run stops between
/// entries (far from done), nothing is left half-written; exit 0.
#[test]
fn a_signal_stops_a_long_first_run_between_entries() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let n = 3000;
    for i in 0..n {
        write(&src, format!("d{}/f{i}", i % 10), &[b'x'; 1000]);
    }
    // 1,000-byte files at 100 KB/s: the first run lasts 30 s at least.
    let mut w = Watch::start(&["sync", "--bwlimit", "100K"], &src, &dst);
    w.until("the first run copying", || {
        dst.is_dir() && walk(&dst).iter().any(|p| dst.join(p).is_file())
    });
    w.signal("INT");
    w.line_with("stopping after the entry in flight");
    let end = Instant::now() + WAIT;
    let code = loop {
        if let Some(s) = w.child.try_wait().unwrap() {
            break s.code();
        }
        assert!(Instant::now() < end, "still running:\n{}", w.stderr());
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(code, Some(0), "{}", w.stderr());
    let files: Vec<_> = walk(&dst)
        .into_iter()
        .filter(|p| dst.join(p).is_file())
        .collect();
    assert!(files.len() < n, "the run went on to the end");
    for p in &files {
        let name = p.file_name().unwrap().as_encoded_bytes();
        assert!(!name.starts_with(TMP_PREFIX), "left behind: {p:?}");
        assert_eq!(fs::read(dst.join(p)).unwrap(), [b'x'; 1000], "{p:?}");
    }
}

/// A rename replayed on DST is a `rename` record with `from`.
#[test]
fn json_rename_records_carry_from() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "d/old", b"data");
    let mut cmd = Command::new(bin());
    cmd.args(["sync", "--json", "--watch"]).arg(&src).arg(&dst);
    let mut w = Watch::spawn_json(cmd);
    converge(&src, &dst, &mut w);
    fs::rename(src.join("d/old"), src.join("d/new")).unwrap();
    converge(&src, &dst, &mut w);
    let end = Instant::now() + WAIT;
    loop {
        let r = w.next_json();
        if r["type"] == "rename" {
            assert_eq!(r["path"], "d/new", "{r}");
            assert_eq!(r["from"], "d/old", "{r}");
            break;
        }
        assert!(Instant::now() < end, "no rename record");
    }
    w.stop_ok();
}

/// The `copy`/`update` records of `path` so far: their sizes (the bytes
/// each sent).
fn sent(w: &mut Watch, path: &str, seen: &mut Vec<u64>) {
    while let Some(r) = w.try_json() {
        if (r["type"] == "copy" || r["type"] == "update") && r["path"] == path {
            seen.push(r["size"].as_u64().unwrap());
        }
    }
}

/// A file that grows while it stays open is synced as it grows, each
/// time only its new tail (its old part checked), never whole again.
#[test]
fn a_growing_file_sends_only_its_new_tails() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["sync", "--json", "--watch"]).arg(&src).arg(&dst);
    let mut w = Watch::spawn_json(cmd);
    w.until("DST made", || dst.is_dir());
    let mut f = fs::File::create(src.join("log")).unwrap();
    let chunk = 4 << 20;
    let mut all = Vec::new();
    for i in 0..3u64 {
        let b = gen_bytes(chunk, i);
        std::io::Write::write_all(&mut f, &b).unwrap();
        all.extend_from_slice(&b);
        // Still open: synced at the watch's cadence for files written
        // without a close.
        w.until("DST/log as written so far", || {
            fs::read(dst.join("log")).is_ok_and(|d| d == all)
        });
    }
    drop(f);
    // Records are written out after each run: those of the runs that
    // made DST equal came before the last wait ended.
    // However the writes fell into runs (a run may take part of a chunk
    // being written: the rest is appended by the next), the records add up
    // to the file once: no byte sent twice.
    let mut seen = Vec::new();
    let end = Instant::now() + WAIT;
    while seen.iter().sum::<u64>() < all.len() as u64 {
        sent(&mut w, "log", &mut seen);
        assert!(Instant::now() < end, "records: {seen:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let total: u64 = seen.iter().sum();
    assert_eq!(total, all.len() as u64, "each byte sent once: {seen:?}");
    w.stop_ok();
}

/// A file removed before the run reaches it (an editor's swap file) is a
/// skip saying it vanished, not an error.
#[test]
fn a_file_that_vanished_before_its_copy_is_no_error() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let n = 300;
    for i in 0..n {
        write(&src, format!("f{i:03}"), &[b'x'; 1000]);
    }
    // 1,000-byte files at 100 KB/s: f299 is reached 3 s after f000.
    let mut w = Watch::start(&["sync", "--bwlimit", "100K"], &src, &dst);
    w.until("the first run copying", || dst.join("f000").exists());
    fs::remove_file(src.join(format!("f{:03}", n - 1))).unwrap();
    converge(&src, &dst, &mut w);
    let err = w.stop_ok();
    assert_eq!(error_lines(&err, "f299"), 0, "{err}");
    assert!(
        err.contains("skipped f299 (vanished"),
        "said as a note:\n{err}"
    );
}

/// An edit in place that keeps the size and puts the mtime back is synced:
/// the watch saw the write.
#[test]
fn an_edit_keeping_size_and_mtime_is_synced() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let p = write(&src, "d/f", b"hello world");
    let mut w = Watch::start(&["sync"], &src, &dst);
    converge(&src, &dst, &mut w);
    let before = get_mtime(&p);
    rewrite_keep_meta(&p, b"HELLO world");
    assert_eq!(get_mtime(&p), before);
    w.until("DST/d/f edited", || {
        fs::read(dst.join("d/f")).is_ok_and(|b| b == b"HELLO world")
    });
    w.stop_ok();
}
