//! `bisync --watch` runs only the directories that changed (issue 16):
//! random edits on both sides end as one whole bisync of the same edits
//! ends, with the journal a whole run would write; one change lists one
//! directory; a watch killed with SIGKILL and started again converges.

mod util;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use util::*;

/// A running `ferry bisync --json --watch`: its JSON lines and its stderr.
struct Watch {
    child: Child,
    out: mpsc::Receiver<serde_json::Value>,
    err: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Watch {
    fn start(journal: &Path, a: &Path, b: &Path) -> Watch {
        Watch::start_with(journal, a, b, &[])
    }

    fn start_with(journal: &Path, a: &Path, b: &Path, extra: &[&str]) -> Watch {
        let mut child = Command::new(bin())
            .args(["bisync", "--watch", "--json", "--max-delete", "100"])
            .args(extra)
            .arg("--journal")
            .arg(journal)
            .arg(a)
            .arg(b)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferry");
        let (so, se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let (to, out) = mpsc::channel();
        let (te, err) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(so).lines().map_while(Result::ok) {
                let v: serde_json::Value = serde_json::from_str(&l).expect("a JSON line");
                eprintln!("watch: {l}");
                if to.send(v).is_err() {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(se).lines().map_while(Result::ok) {
                if te.send(l).is_err() {
                    break;
                }
            }
        });
        Watch {
            child,
            out,
            err,
            seen: Vec::new(),
        }
    }

    fn stderr(&mut self) -> String {
        while let Ok(l) = self.err.try_recv() {
            self.seen.push(l);
        }
        self.seen.join("\n")
    }

    /// The run summaries that came so far.
    fn summaries(&mut self) -> Vec<serde_json::Value> {
        let mut v = Vec::new();
        while let Ok(l) = self.out.try_recv() {
            if l["type"] == "summary" {
                v.push(l);
            }
        }
        v
    }

    /// The next run summary (waits for it).
    fn summary(&mut self) -> serde_json::Value {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(l) if l["type"] == "summary" => return l,
                Ok(_) => {}
                Err(_) => panic!("no run summary; stderr:\n{}", self.stderr()),
            }
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// SIGTERM: exits 0.
    fn stop(mut self) {
        self.signal("TERM");
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                assert_eq!(s.code(), Some(0), "{}", self.stderr());
                return;
            }
            assert!(Instant::now() < end, "no exit:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What bisync keeps equal: each path's kind, and a file's bytes, mtime
/// and mode (directory mtimes are each side's own). The time stamp of a
/// conflict name is left out (two runs name conflicts by their minute).
type Snap = BTreeMap<String, (char, Vec<u8>, i128, u32)>;

fn unstamp(p: &str) -> String {
    match p.find("(conflict ") {
        Some(i) if p.len() >= i + 25 => format!("{}(conflict STAMP{}", &p[..i], &p[i + 25..]),
        _ => p.to_string(),
    }
}

fn snap(root: &Path) -> Snap {
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

fn diff(x: &Snap, y: &Snap) -> Vec<String> {
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
/// `want`; the bound only keeps a broken watch from hanging the suite.
fn converge(a: &Path, b: &Path, want: Option<&Snap>, w: &mut Watch) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let (sa, sb) = (snap(a), snap(b));
        if sa == sb && want.is_none_or(|x| *x == sa) {
            return;
        }
        if Instant::now() > end {
            panic!(
                "no convergence:\nA vs B: {:?}\nA vs reference: {:?}\nstderr:\n{}",
                diff(&sa, &sb),
                want.map(|x| diff(&sa, x)),
                w.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
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
fn records(journal: &Path, a: &Path, b: &Path) -> Vec<(Vec<u8>, ferry_bisync::reconcile::Synced)> {
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
        let mut w = Watch::start_with(&j, &a, &b, &["--force"]);
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
        w.stop();
        assert_eq!(sums[0]["scoped"], 0, "seed {seed}: the first run is whole");
        for (i, s) in sums.iter().enumerate().skip(1) {
            assert!(
                s["scoped"] == 1 || sums[i - 1]["errors"].as_u64() > Some(0),
                "seed {seed}: a whole run after a clean scoped one: {sums:?}"
            );
        }
        let before = records(&j, &a, &b);
        let r = bisync(&j, &a, &b, &[]);
        r.ok();
        let out = r.out();
        let acts: Vec<&str> = out
            .lines()
            .filter(|l| !l.contains("\"type\":\"summary\""))
            .collect();
        assert!(
            acts.is_empty(),
            "seed {seed}: a whole run after the watch: {acts:?}"
        );
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
    let mut w = Watch::start(&j, &a, &b);
    let first = w.summary();
    assert_eq!(first["scoped"], 0, "{first}");
    assert!(
        first["entries_scanned"].as_u64().unwrap() >= 1000,
        "{first}"
    );
    converge(&a, &b, None, &mut w);
    // The runs for the first run's own writes on B (scoped too).
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let late = w.summaries();
        assert!(late.iter().all(|r| r["scoped"] == 1), "{late:?}");
        if late.is_empty() {
            break;
        }
    }
    write(&a, "d07/new", b"new");
    let end = Instant::now() + Duration::from_secs(60);
    let mut runs = Vec::new();
    while fs::read(b.join("d07/new")).ok().as_deref() != Some(b"new") {
        assert!(Instant::now() < end, "not synced:\n{}", w.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    runs.push(w.summary());
    std::thread::sleep(Duration::from_millis(500));
    runs.extend(w.summaries());
    // The run that copied it, and maybe one for the copy's own events.
    for r in &runs {
        assert_eq!(r["scoped"], 1, "{runs:?}");
        // d07 on both sides: 26 entries on A, 25 or 26 on B.
        assert!(r["entries_scanned"].as_u64().unwrap() <= 52, "{runs:?}");
    }
    assert!(runs.iter().any(|r| r["files_copied"] == 1), "{runs:?}");
    w.stop();
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
    let mut w = Watch::start(&j, &a, &b);
    converge(&a, &b, None, &mut w);
    // Deleted on A and synced, then many new files when the kill comes.
    fs::remove_file(a.join("old/o3")).unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while b.join("old/o3").exists() {
        assert!(Instant::now() < end, "not deleted:\n{}", w.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    for d in 0..10 {
        for f in 0..50 {
            write(&a, format!("n{d}/f{f}"), &vec![b'n'; 4096]);
        }
    }
    fs::rename(a.join("old/o5"), a.join("n3/o5")).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    w.signal("KILL");
    let _ = w.child.wait();
    drop(w);
    // Changed on both sides while nothing watched.
    write(&b, "old/o7", b"changed on B");
    fs::remove_file(b.join("old/o9")).unwrap();
    write(&a, "n0/late", b"late");
    let mut w = Watch::start(&j, &a, &b);
    converge(&a, &b, None, &mut w);
    w.stop();
    assert!(!a.join("old/o3").exists() && !b.join("old/o9").exists());
    assert!(!a.join("old/o9").exists());
    assert_eq!(fs::read(a.join("old/o7")).unwrap(), b"changed on B");
    assert_eq!(fs::read(b.join("n3/o5")).unwrap(), b"old");
    let r = bisync(&j, &a, &b, &[]);
    r.ok();
    let out = r.out();
    let acts: Vec<&str> = out
        .lines()
        .filter(|l| !l.contains("\"type\":\"summary\""))
        .collect();
    assert!(acts.is_empty(), "a whole run after the watch: {acts:?}");
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
    let mut w = Watch::start(&j, &a, &b);
    converge(&a, &b, None, &mut w);
    for e in fs::read_dir(&b).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            fs::remove_dir_all(p).unwrap();
        } else {
            fs::remove_file(p).unwrap();
        }
    }
    let end = Instant::now() + Duration::from_secs(60);
    while !w.stderr().contains("is empty, but held") {
        assert!(Instant::now() < end, "no refusal:\n{}", w.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(walk(&a).len(), 12, "{}", w.stderr());
    // Still watching, and still refusing at the next change.
    let said = w.stderr().matches("is empty, but held").count();
    write(&a, "d/later", b"later");
    let end = Instant::now() + Duration::from_secs(60);
    while w.stderr().matches("is empty, but held").count() == said {
        assert!(Instant::now() < end, "no run:\n{}", w.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(walk(&a).len(), 13, "{}", w.stderr());
    assert!(walk(&b).is_empty());
    w.stop();
}
