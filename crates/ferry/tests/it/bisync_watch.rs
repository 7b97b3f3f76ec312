//! `bisync --watch` runs only the directories that changed (issue 16):
//! random edits on both sides end as one whole bisync of the same edits
//! ends, with the journal a whole run would write; one change lists one
//! directory; a watch killed with SIGKILL and started again converges.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::util::watch::{concurrent_writer, odd, Watch, ODD};
use crate::util::*;

/// `ferry bisync --watch --json --max-delete 100 [EXTRA] --journal J A B`.
fn watch(journal: &Path, a: &Path, b: &Path, extra: &[&str]) -> Watch {
    let mut cmd = Command::new(bin());
    cmd.args(["bisync", "--watch", "--json", "--max-delete", "100"])
        .args(extra)
        .arg("--journal")
        .arg(journal)
        .arg(a)
        .arg(b);
    Watch::spawn_json(cmd)
}

/// What bisync keeps equal: each path's kind, and a file's bytes, mtime
/// and mode (directory mtimes are each side's own). The time stamp of a
/// conflict name is left out (two runs name conflicts by their minute).
pub(crate) type Snap = BTreeMap<String, (char, Vec<u8>, i128, u32)>;

fn unstamp(p: &str) -> String {
    match p.find("(conflict ") {
        Some(i) if p.len() >= i + 25 => format!("{}(conflict STAMP{}", &p[..i], &p[i + 25..]),
        _ => p.to_string(),
    }
}

pub(crate) fn snap(root: &Path) -> Snap {
    let mut m = Snap::new();
    for p in walk(root) {
        let full = root.join(&p);
        let Ok(md) = fs::symlink_metadata(&full) else {
            continue;
        };
        let key = unstamp(&p.to_string_lossy());
        if md.is_dir() {
            m.insert(key, ('d', Vec::new(), 0, 0));
        } else {
            let t = md
                .modified()
                .unwrap()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as i128;
            let bytes = fs::read(&full).unwrap_or_default();
            m.insert(key, ('f', bytes, t, md.permissions().mode() & 0o7777));
        }
    }
    m
}

pub(crate) fn diff(x: &Snap, y: &Snap) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in x {
        match y.get(k) {
            None => out.push(format!("{k}: only in the first")),
            Some(w) if w != v => out.push(format!("{k}: differs ({} vs {})", v.0, w.0)),
            _ => {}
        }
    }
    for k in y.keys() {
        if !x.contains_key(k) {
            out.push(format!("{k}: only in the second"));
        }
    }
    out
}

/// Wait until `a` and `b` hold the same tree, and (if given) the one of
/// `want`.
fn converge(a: &Path, b: &Path, want: Option<&Snap>, w: &mut Watch) {
    w.until_none(|| {
        let (sa, sb) = (snap(a), snap(b));
        if sa == sb && want.is_none_or(|x| *x == sa) {
            return None;
        }
        Some(format!(
            "no convergence:\nA vs B: {:?}\nA vs reference: {:?}",
            diff(&sa, &sb),
            want.map(|x| diff(&sa, x)),
        ))
    });
}

/// A file written with the bytes and mtime a test gives it.
fn put(path: &Path, data: &[u8], secs: u64) {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(path, data).unwrap();
    let f = fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        .unwrap();
}

fn canon(p: &Path) -> PathBuf {
    fs::canonicalize(p).unwrap()
}

/// Empty replicas `a` and `b` in `t`, by their canonical paths.
fn pair(t: &tempfile::TempDir) -> (PathBuf, PathBuf) {
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    (canon(&a), canon(&b))
}

/// One random edit, chosen by looking at `pair[side]` and made the same
/// way in each pair of `pairs` (each `[A, B]`).
fn edit(rng: &mut Rng, pairs: &[[&Path; 2]], stamp: &mut u64) {
    let side = rng.range(0, 2) as usize;
    let root = pairs[0][side];
    let all = walk(root);
    let usable = |p: &PathBuf| !p.to_string_lossy().contains("conflict");
    let files: Vec<PathBuf> = all
        .iter()
        .filter(|p| usable(p) && root.join(p).is_file())
        .cloned()
        .collect();
    let mut dirs: Vec<PathBuf> = vec![PathBuf::new()];
    dirs.extend(
        all.iter()
            .filter(|p| usable(p) && root.join(p).is_dir())
            .cloned(),
    );
    let pick = |rng: &mut Rng, v: &[PathBuf]| v[rng.range(0, v.len() as u64) as usize].clone();
    *stamp += 1;
    let secs = 1_700_000_000 + *stamp * 7;
    let data = format!("edit {stamp} side {side}").into_bytes();
    let each = |f: &dyn Fn(&Path)| {
        for p in pairs {
            f(p[side]);
        }
    };
    match rng.range(0, 10) {
        // Create or overwrite a file.
        0..=2 => {
            let rel = pick(rng, &dirs).join(format!("f{}", rng.range(0, 5)));
            if root.join(&rel).is_dir() {
                return;
            }
            eprintln!("op: {side} write {}", rel.display());
            each(&|r| put(&r.join(&rel), &data, secs));
        }
        // A new directory with a file in it.
        3 => {
            let rel = pick(rng, &dirs).join(format!("d{}", rng.range(0, 3)));
            if root.join(&rel).exists() {
                return;
            }
            eprintln!("op: {side} mkdir {}/g", rel.display());
            each(&|r| put(&r.join(&rel).join("g"), &data, secs));
        }
        // Rename a file, maybe into another directory.
        4 => {
            if files.is_empty() {
                return;
            }
            let from = pick(rng, &files);
            let to = pick(rng, &dirs).join(format!("r{}", rng.range(0, 5)));
            if root.join(&to).exists() {
                return;
            }
            eprintln!("op: {side} mv {} {}", from.display(), to.display());
            each(&|r| fs::rename(r.join(&from), r.join(&to)).unwrap());
        }
        // Rename a directory (not into itself).
        5 => {
            if dirs.len() < 2 {
                return;
            }
            let from = pick(rng, &dirs[1..]);
            let to = pick(rng, &dirs).join(format!("m{}", rng.range(0, 3)));
            if to.starts_with(&from) || root.join(&to).exists() {
                return;
            }
            eprintln!("op: {side} mvdir {} {}", from.display(), to.display());
            each(&|r| fs::rename(r.join(&from), r.join(&to)).unwrap());
        }
        // Delete a file.
        6 => {
            if files.is_empty() {
                return;
            }
            let rel = pick(rng, &files);
            eprintln!("op: {side} rm {}", rel.display());
            each(&|r| fs::remove_file(r.join(&rel)).unwrap());
        }
        // Delete a directory and all of it.
        7 => {
            if dirs.len() < 2 {
                return;
            }
            let rel = pick(rng, &dirs[1..]);
            eprintln!("op: {side} rm -r {}", rel.display());
            each(&|r| fs::remove_dir_all(r.join(&rel)).unwrap());
        }
        // A conflict: the same file changed on both sides.
        _ => {
            let both: Vec<PathBuf> = files
                .iter()
                .filter(|p| pairs[0][1 - side].join(p).is_file())
                .cloned()
                .collect();
            if both.is_empty() {
                return;
            }
            let rel = pick(rng, &both);
            eprintln!("op: conflict {}", rel.display());
            for p in pairs {
                put(&p[0].join(&rel), b"conflict on A", secs);
                put(&p[1].join(&rel), b"conflict on B!", secs + 1);
            }
        }
    }
}

/// Every record of a journal, by key (what a run reads).
pub(crate) fn records(
    journal: &Path,
    a: &Path,
    b: &Path,
) -> Vec<(Vec<u8>, ferry_bisync::reconcile::Synced)> {
    use ferry_bisync::journal::Records;
    let ids = (a.to_string_lossy(), b.to_string_lossy());
    let j = ferry_bisync::Journal::open(journal, (&ids.0, &ids.1)).unwrap();
    let mut dirs = Vec::new();
    j.each_dir(&mut |d| dirs.push(d.to_vec())).unwrap();
    let mut v = Vec::new();
    for d in dirs {
        for (n, s) in j.dir(&d).unwrap().iter() {
            let mut k = d.clone();
            if !k.is_empty() {
                k.push(0);
            }
            k.extend_from_slice(n);
            // The conflict names' minutes left out, as in `snap`.
            let k = unstamp(&String::from_utf8_lossy(&k)).into_bytes();
            v.push((k, s));
        }
    }
    v.sort_by(|x, y| x.0.cmp(&y.0));
    v
}

fn bisync(journal: &Path, a: &Path, b: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<std::ffi::OsString> = vec!["bisync".into(), "--json".into()];
    args.extend(extra.iter().map(|s| s.into()));
    args.extend([
        "--max-delete".into(),
        "100".into(),
        "--journal".into(),
        journal.into(),
        a.into(),
        b.into(),
    ]);
    ferry(args)
}

/// A whole `ferry bisync` after the watch (`what` names the case): it succeeds and has
/// nothing to do.
#[track_caller]
fn whole_run_does_nothing(journal: &Path, a: &Path, b: &Path, what: &str) {
    let r = bisync(journal, a, b, &[]);
    r.ok();
    let out = r.out();
    let acts: Vec<&str> = out
        .lines()
        .filter(|l| !l.contains("\"type\":\"summary\""))
        .collect();
    assert!(
        acts.is_empty(),
        "{what}: a whole run after the watch: {acts:?}"
    );
}

/// Random edits on both sides, a round at a time (made while the watch is
/// stopped, so a round is one set of changes, as a whole run would see
/// it): the watched replicas end as a whole bisync of a copy of them ends
/// after each round, and the watch's journal is the one a whole run
/// writes (a whole run afterwards does nothing and changes no record; a
/// fresh `--resync` records the same).
#[test]
fn scoped_runs_end_as_whole_runs_do() {
    // FERRY_WATCH_SEEDS=N tries more seeds (3 by default).
    let seeds: u64 = std::env::var("FERRY_WATCH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for seed in 1..=seeds {
        let t = tmpdir();
        let mk = |n: &str| {
            let p = t.path().join(n);
            fs::create_dir(&p).unwrap();
            canon(&p)
        };
        let (a, b, ra, rb) = (mk("a"), mk("b"), mk("ra"), mk("rb"));
        let (j, rj) = (t.path().join("j.sqlite"), t.path().join("rj.sqlite"));
        let mut stamp = 0;
        for i in 0..12u64 {
            let rel = format!("s{}/f{}", i % 3, i);
            for r in [&a, &ra] {
                put(&r.join(&rel), rel.as_bytes(), 1_600_000_000 + i);
            }
        }
        // (--force: a round may empty a side, which both refuse without.)
        bisync(&rj, &ra, &rb, &["--force"]).ok();
        let mut w = watch(&j, &a, &b, &["--force"]);
        converge(&a, &b, Some(&snap(&ra)), &mut w);
        let mut rng = Rng::new(seed);
        for round in 0..6 {
            w.signal("STOP");
            eprintln!("seed {seed} round {round}");
            for _ in 0..rng.range(1, 6) {
                edit(&mut rng, &[[&a, &b], [&ra, &rb]], &mut stamp);
            }
            w.signal("CONT");
            bisync(&rj, &ra, &rb, &["--force"]).ok();
            let want = snap(&ra);
            assert!(
                diff(&want, &snap(&rb)).is_empty(),
                "seed {seed} round {round}: the whole run did not converge"
            );
            converge(&a, &b, Some(&want), &mut w);
        }
        // Every run after the first was scoped, but for the whole run
        // that follows a scoped run with errors (an entry that changed
        // under it: the loop's fallback).
        let sums = w.summaries();
        w.stop_ok();
        assert_eq!(sums[0]["scoped"], 0, "seed {seed}: the first run is whole");
        for (i, s) in sums.iter().enumerate().skip(1) {
            assert!(
                s["scoped"] == 1 || sums[i - 1]["errors"].as_u64() > Some(0),
                "seed {seed}: a whole run after a clean scoped one: {sums:?}"
            );
        }
        let before = records(&j, &a, &b);
        whole_run_does_nothing(&j, &a, &b, &format!("seed {seed}"));
        assert!(
            before == records(&j, &a, &b),
            "seed {seed}: the whole run changed the journal"
        );
        let fresh = t.path().join("fresh.sqlite");
        bisync(&fresh, &a, &b, &["--resync"]).ok();
        let fresh = records(&fresh, &a, &b);
        let keys = |v: &[(Vec<u8>, ferry_bisync::reconcile::Synced)]| -> Vec<String> {
            v.iter()
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                .collect()
        };
        assert_eq!(keys(&before), keys(&fresh), "seed {seed}: journal paths");
        assert!(before == fresh, "seed {seed}: journal records");
    }
}

/// The concurrent-writer step of the model test: while the watch runs, a
/// writer on each side (writes, appends, replaces, deletes at random
/// moments, `--bwlimit` widening each copy's window). Once it settles, both sides hold the same tree, each
/// writer's files hold on both sides the bytes last written, and nothing outside the roots changed.
#[test]
fn concurrent_writers_on_both_sides_lose_nothing() {
    let t = tmpdir();
    let (a, b) = pair(&t);
    let outside = t.path().join("outside");
    write(&outside, "keep", b"not synced");
    let outside_before = snapshot(&outside);
    // (Something to sync, so that the first run is done when B has it.)
    write(&a, "t/seed", b"seed");
    let j = t.path().join("j.sqlite");
    let mut w = watch(&j, &a, &b, &["--bwlimit", "4M"]);
    converge(&a, &b, None, &mut w);
    for round in 0..3u64 {
        let (ra, rb) = (a.clone(), b.clone());
        let wa = std::thread::spawn(move || concurrent_writer(ra, "wa", 200 + round, 40));
        let wb = std::thread::spawn(move || concurrent_writer(rb, "wb", 300 + round, 40));
        let (ma, mb) = (wa.join().unwrap(), wb.join().unwrap());
        converge(&a, &b, None, &mut w);
        for (root, model) in [(&a, &ma), (&b, &mb)] {
            for (name, data) in model {
                for side in [&a, &b] {
                    let got = fs::read(side.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert!(
                        got == *data,
                        "{name} (written in {}): {} does not hold the bytes last written",
                        root.display(),
                        side.display()
                    );
                }
            }
        }
    }
    w.stop_ok();
    assert_untouched(&outside_before, &snapshot(&outside));
}

/// After the first (whole) run, one changed file lists its directory on
/// both sides and nothing else: each run's summary counts the entries it
/// listed.
#[test]
fn one_change_lists_one_directory() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    fs::create_dir(&b).unwrap();
    for d in 0..40 {
        for f in 0..25 {
            write(&a, format!("d{d:02}/f{f:02}"), b"x");
        }
    }
    let (a, b) = (canon(&a), canon(&b));
    let j = t.path().join("j.sqlite");
    let mut w = watch(&j, &a, &b, &[]);
    let first = w.summary();
    assert_eq!(first["scoped"], 0, "{first}");
    assert!(
        first["entries_scanned"].as_u64().unwrap() >= 1000,
        "{first}"
    );
    converge(&a, &b, None, &mut w);
    // The runs for the first run's own writes on B (scoped too). A quiet
    // half second is the end of them, a negative no event stands in for:
    // they come in a trickle (a later change of B was seen to run before
    // the last of them).
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let late = w.summaries();
        assert!(late.iter().all(|r| r["scoped"] == 1), "{late:?}");
        if late.is_empty() {
            break;
        }
    }
    write(&a, "d07/new", b"new");
    let mut runs = Vec::new();
    w.until("not synced", || {
        fs::read(b.join("d07/new")).ok().as_deref() == Some(b"new")
    });
    runs.push(w.summary());
    // Until the run that copied it, and those that came with it so far.
    while !runs.iter().any(|r| r["files_copied"] == 1) {
        runs.push(w.summary());
    }
    runs.extend(w.summaries());
    // The run that copied it, and maybe one for the copy's own events.
    for r in &runs {
        assert_eq!(r["scoped"], 1, "{runs:?}");
        // d07 on both sides: 26 entries on A, 25 or 26 on B.
        assert!(r["entries_scanned"].as_u64().unwrap() <= 52, "{runs:?}");
    }
    assert!(runs.iter().any(|r| r["files_copied"] == 1), "{runs:?}");
    w.stop_ok();
}

/// A watch killed with SIGKILL in the middle of its work, then started
/// again while both sides changed: it converges, a deletion made before the
/// kill does not come back, and a whole run afterwards does nothing.
#[test]
fn killed_watch_restarted_converges() {
    let t = tmpdir();
    let (a, b) = pair(&t);
    for i in 0..20 {
        write(&a, format!("old/o{i}"), b"old");
    }
    let j = t.path().join("j.sqlite");
    let mut w = watch(&j, &a, &b, &[]);
    converge(&a, &b, None, &mut w);
    // Deleted on A and synced, then many new files when the kill comes.
    fs::remove_file(a.join("old/o3")).unwrap();
    w.until("not deleted", || !b.join("old/o3").exists());
    for d in 0..10 {
        for f in 0..50 {
            write(&a, format!("n{d}/f{f}"), &vec![b'n'; 4096]);
        }
    }
    fs::rename(a.join("old/o5"), a.join("n3/o5")).unwrap();
    // Killed once it is at work on them.
    w.until("the new files on their way", || {
        (0..10).any(|d| b.join(format!("n{d}")).exists())
    });
    w.kill();
    drop(w);
    // Changed on both sides while nothing watched.
    write(&b, "old/o7", b"changed on B");
    fs::remove_file(b.join("old/o9")).unwrap();
    write(&a, "n0/late", b"late");
    let mut w = watch(&j, &a, &b, &[]);
    converge(&a, &b, None, &mut w);
    w.stop_ok();
    assert!(!a.join("old/o3").exists() && !b.join("old/o9").exists());
    assert!(!a.join("old/o9").exists());
    assert_eq!(fs::read(a.join("old/o7")).unwrap(), b"changed on B");
    assert_eq!(fs::read(b.join("n3/o5")).unwrap(), b"old");
    whole_run_does_nothing(&j, &a, &b, "after the restart");
}

/// A side emptied while watched (an unmounted disk looks like that): the
/// scoped run leaves it to a whole run, which refuses (as a run without
/// `--watch` does); nothing is deleted on the other side, and the watch
/// goes on.
#[test]
fn an_emptied_side_deletes_nothing_on_the_other() {
    let t = tmpdir();
    let (a, b) = pair(&t);
    for i in 0..10 {
        write(&a, format!("d/f{i}"), b"x");
    }
    write(&a, "top", b"x");
    let j = t.path().join("j.sqlite");
    let mut w = watch(&j, &a, &b, &[]);
    converge(&a, &b, None, &mut w);
    // At once, as an unmount does (the empty mount point left in its
    // place): entries removed one by one could each be a real delete.
    // (Refused as another directory than the one watched, before it is
    // seen empty.)
    fs::rename(&b, t.path().join("b.gone")).unwrap();
    fs::create_dir(&b).unwrap();
    let line = w.line_with("(watching on)");
    assert!(line.contains("is not the directory watched"), "{line}");
    assert_eq!(walk(&a).len(), 12, "{}", w.stderr());
    // Still watching, and still refusing at the next change.
    let said = w.stderr().matches("(watching on)").count();
    write(&a, "d/later", b"later");
    w.nth_line_with("(watching on)", said + 1);
    assert_eq!(walk(&a).len(), 13, "{}", w.stderr());
    assert!(walk(&b).is_empty());
    w.stop_ok();
}

/// Every path below `root`, exactly as its bytes are.
fn names(root: &Path) -> Vec<Vec<u8>> {
    walk(root)
        .into_iter()
        .map(|p| p.into_os_string().into_vec())
        .collect()
}

/// Names with a newline, non-UTF-8 bytes, spaces and a leading dash,
/// created, renamed and deleted on both sides while watched, in new and
/// existing directories (some with such names too): both sides end as a
/// reference tree given the same edits, name for name, and a whole run
/// afterwards has nothing to do.
#[test]
fn odd_names_converge_while_watching() {
    let t = tmpdir();
    let (a, b) = pair(&t);
    let r = t.path().join("r");
    fs::create_dir(&r).unwrap();
    let old_odd = odd("-old ", b"caf\xe9\n");
    let mut secs = 1_650_000_000;
    // Each edit is made on one side and on the reference.
    let mut put_on = |side: &Path, rel: &Path| {
        secs += 1;
        for root in [side, r.as_path()] {
            put(&root.join(rel), rel.as_os_str().as_bytes(), secs);
        }
    };
    for n in ODD {
        put_on(&a, &Path::new("old").join(odd("o", n)));
        put_on(&a, &old_odd.join(odd("o", n)));
    }
    let j = t.path().join("j.sqlite");
    let mut w = watch(&j, &a, &b, &[]);
    let check = |w: &mut Watch, phase: &str| {
        converge(&a, &b, Some(&snap(&r)), w);
        let want = names(&r);
        assert_eq!(names(&a), want, "{phase}: A");
        assert_eq!(names(&b), want, "{phase}: B");
    };
    check(&mut w, "first run");
    // Made on A: in existing directories and in new ones.
    for n in ODD {
        put_on(&a, &Path::new("old").join(odd("a", n)));
        put_on(&a, &old_odd.join(odd("a", n)));
        put_on(&a, &odd("new-", n).join(os(n)));
    }
    check(&mut w, "created on A");
    // On B: renamed into the other existing directory, new directories
    // made, and A's new directories renamed.
    let both = |side: &Path, f: &dyn Fn(&Path)| {
        f(side);
        f(&r);
    };
    for n in ODD {
        both(&b, &|root| {
            fs::rename(
                root.join("old").join(odd("a", n)),
                root.join(&old_odd).join(odd("r", n)),
            )
            .unwrap();
            fs::rename(root.join(odd("new-", n)), root.join(odd("moved-", n))).unwrap();
        });
        put_on(&b, &odd("b-new ", n).join(odd("b", n)));
    }
    check(&mut w, "renamed and created on B");
    // Deleted on both sides: files that were there before the watch, the
    // files renamed on B, and directories renamed on B.
    for n in ODD {
        both(&a, &|root| {
            fs::remove_file(root.join("old").join(odd("o", n))).unwrap();
            fs::remove_file(root.join(&old_odd).join(odd("r", n))).unwrap();
        });
        both(&b, &|root| {
            fs::remove_dir_all(root.join(odd("moved-", n))).unwrap();
            fs::remove_file(root.join(&old_odd).join(odd("o", n))).unwrap();
        });
    }
    check(&mut w, "deleted on both sides");
    w.stop_ok();
    whole_run_does_nothing(&j, &a, &b, "odd names");
}
