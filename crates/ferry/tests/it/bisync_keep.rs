//! `ferry bisync` keeps what it replaces or deletes, on each replica (#17):
//! `--versions` (each replica's own `.ferry-versions`), `--backup-dir`
//! (relative: each replica's own), `--backup-dir1`/`--backup-dir2`, `--suffix`.
//! A property test (random edits on both sides, every version that existed
//! before a run is afterwards on its side or kept there, byte-equal), then one
//! test per rule: kept entries never cross, conflicts keep both, a failed keep
//! leaves the entry and exits 1, dry runs change nothing, refusals.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;
use ferry_engine::keep::parse_version_name;
use proptest::prelude::{any, prop, prop_assert, prop_assert_eq, proptest, ProptestConfig};

/// The injected clock of the runs (`20261125-163343` UTC).
const NOW: i64 = 1_795_624_423;
const VERSIONS: &str = ".ferry-versions";

/// Two replicas in directories of their own (`ra/root`, `rb/root`), so that a
/// relative `--backup-dir ../old` is a different directory for each.
struct Pair {
    t: tempfile::TempDir,
    a: PathBuf,
    b: PathBuf,
    j: PathBuf,
}

fn pair() -> Pair {
    let t = tmpdir();
    let (a, b) = (t.path().join("ra/root"), t.path().join("rb/root"));
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    let j = t.path().join("state/j.sqlite");
    Pair { t, a, b, j }
}

impl Pair {
    /// `ferry bisync --journal J [extra] A B` at `now`.
    fn run_at(&self, now: i64, extra: &[&str]) -> Run {
        let mut c = Command::new(bin());
        c.env("FERRY_TEST_NOW", now.to_string())
            .stdin(Stdio::null())
            .arg("bisync")
            .arg("--journal")
            .arg(&self.j)
            .args(extra)
            .arg(&self.a)
            .arg(&self.b);
        run_within(c, Duration::from_secs(600))
    }

    fn run(&self, extra: &[&str]) -> Run {
        self.run_at(NOW, extra)
    }

    /// A path beside the replicas.
    fn at(&self, rel: &str) -> PathBuf {
        self.t.path().join(rel)
    }
}

/// A file's bytes, a symlink's target, or a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Link(Vec<u8>),
    Dir,
}

type State = BTreeMap<String, Node>;

fn node(p: &Path) -> Node {
    let md = fs::symlink_metadata(p).unwrap();
    if md.file_type().is_symlink() {
        Node::Link(fs::read_link(p).unwrap().as_os_str().as_bytes().to_vec())
    } else if md.is_dir() {
        Node::Dir
    } else {
        Node::File(fs::read(p).unwrap())
    }
}

/// A replica as synced: without `.ferry-versions` (at any depth) and the
/// top-level names in `skip` (a backup directory inside it).
fn state(root: &Path, skip: &[&str]) -> State {
    walk(root)
        .into_iter()
        .filter(|rel| {
            let mut cs = rel.components().map(|c| c.as_os_str().to_string_lossy());
            let first = cs.next().unwrap_or_default();
            !skip.contains(&&*first) && first != VERSIONS && !cs.any(|c| c == VERSIONS)
        })
        .map(|rel| (rel.to_string_lossy().into_owned(), node(&root.join(&rel))))
        .collect()
}

/// Every file and symlink below `dir` (none if it does not exist), by path.
fn kept_in(dir: &Path) -> Vec<(String, Node)> {
    if !dir.exists() {
        return Vec::new();
    }
    walk(dir)
        .into_iter()
        .map(|rel| (rel.to_string_lossy().into_owned(), node(&dir.join(&rel))))
        .filter(|(_, n)| *n != Node::Dir)
        .collect()
}

/// The versions kept in a replica's `.ferry-versions`, by the path of the
/// file each is a version of (every name there must parse as a version's).
fn versions(root: &Path) -> Vec<(String, Node)> {
    kept_in(&root.join(VERSIONS))
        .into_iter()
        .map(|(rel, n)| {
            let (dir, name) = match rel.rfind('/') {
                Some(i) => (&rel[..=i], &rel[i + 1..]),
                None => ("", &rel[..]),
            };
            let (orig, _t, _n) = parse_version_name(name.as_bytes())
                .unwrap_or_else(|| panic!("{rel}: not a version's name"));
            (format!("{dir}{}", String::from_utf8(orig).unwrap()), n)
        })
        .collect()
}

/// What of `before` (a side's files and symlinks before a run) is neither
/// on that side afterwards (at any path: a conflict renames; every write's
/// bytes are unique) nor kept there at its own path, byte-equal.
fn lost(before: &State, after: &State, kept: &[(String, Node)]) -> Vec<String> {
    before
        .iter()
        .filter(|(_, n)| **n != Node::Dir)
        .filter(|(p, n)| {
            !after.values().any(|m| m == *n) && !kept.iter().any(|(q, m)| q == *p && m == *n)
        })
        .map(|(p, n)| format!("{p}: {n:?}"))
        .collect()
}

// ------------------------------------------------------------------------------------------
// Random edits
// ------------------------------------------------------------------------------------------

const NAMES: [&str; 4] = ["a", "b.txt", "c", "d.md"];

fn rand_path(rng: &mut Rng) -> String {
    let depth = rng.range(1, 4);
    (0..depth)
        .map(|_| NAMES[rng.range(0, NAMES.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join("/")
}

/// Entries of a replica (files and symlinks, or directories).
fn pick(root: &Path, dirs: bool, rng: &mut Rng) -> Option<PathBuf> {
    let v: Vec<PathBuf> = state(root, &[".old"])
        .into_iter()
        .filter(|(_, n)| (*n == Node::Dir) == dirs)
        .map(|(p, _)| PathBuf::from(p))
        .collect();
    (!v.is_empty()).then(|| v[rng.range(0, v.len() as u64) as usize].clone())
}

/// True when no parent of `rel` in `root` is a file or symlink.
fn can_create(root: &Path, rel: &Path) -> bool {
    let mut q = root.to_path_buf();
    for c in rel.parent().into_iter().flat_map(|x| x.components()) {
        q.push(c);
        if fs::symlink_metadata(&q).is_ok_and(|m| !m.is_dir()) {
            return false;
        }
    }
    true
}

/// Write unique bytes (the write's number in them) with a distinct mtime.
fn put_unique(root: &Path, rel: &Path, clock: u64) {
    let p = write(
        root,
        rel,
        format!("write #{clock} of {}", rel.display()).as_bytes(),
    );
    set_mtime(&p, (1_600_000_000 + clock as i64, 0));
}

/// One random edit of `root` (a no-op when it does not apply): create or
/// overwrite, modify, delete a file, remove a directory tree, change a type,
/// make a symlink, make a directory.
fn edit(root: &Path, op: u8, seed: u64, clock: &mut u64) {
    *clock += 1;
    let rng = &mut Rng::new(seed);
    match op % 7 {
        0 => {
            let p = PathBuf::from(rand_path(rng));
            if can_create(root, &p) && !root.join(&p).is_dir() {
                let _ = fs::remove_file(root.join(&p));
                put_unique(root, &p, *clock);
            }
        }
        1 => {
            if let Some(p) = pick(root, false, rng) {
                if fs::symlink_metadata(root.join(&p)).unwrap().is_file() {
                    put_unique(root, &p, *clock);
                }
            }
        }
        2 => {
            if let Some(p) = pick(root, false, rng) {
                fs::remove_file(root.join(p)).unwrap();
            }
        }
        3 => {
            if let Some(p) = pick(root, true, rng) {
                fs::remove_dir_all(root.join(p)).unwrap();
            }
        }
        4 => {
            let p = if rng.chance(1, 2) {
                pick(root, true, rng)
            } else {
                pick(root, false, rng)
            };
            if let Some(p) = p {
                let full = root.join(&p);
                if full.is_dir() && !full.is_symlink() {
                    fs::remove_dir_all(&full).unwrap();
                    put_unique(root, &p, *clock);
                } else {
                    fs::remove_file(&full).unwrap();
                    put_unique(root, &p.join("inside"), *clock);
                }
            }
        }
        5 => {
            let p = PathBuf::from(rand_path(rng));
            let full = root.join(&p);
            if (full.is_symlink() || !full.is_dir()) && can_create(root, &p) {
                if let Some(parent) = full.parent() {
                    fs::create_dir_all(parent).unwrap();
                }
                let _ = fs::remove_file(&full);
                std::os::unix::fs::symlink(format!("target-{clock}"), &full).unwrap();
            }
        }
        _ => {
            let p = PathBuf::from(rand_path(rng));
            if can_create(root, &p) && fs::symlink_metadata(root.join(&p)).is_err() {
                fs::create_dir_all(root.join(&p)).unwrap();
            }
        }
    }
}

/// How a case keeps: `--versions`, a relative `--backup-dir` outside each
/// replica (one per run), or one inside each replica.
#[derive(Clone, Copy, Debug)]
enum How {
    Versions,
    Outside,
    Inside,
}

/// Sync a random tree once, then each round: random edits on both sides, a
/// bisync that keeps; nothing of either side is lost, the replicas agree.
fn keep_case(how: How, init: &[u64], rounds: &[Vec<(u8, u8, u64)>]) -> Result<(), String> {
    let p = pair();
    let mut clock = 0;
    for &s in init {
        edit(&p.a, [0, 5, 6][(s % 3) as usize], s, &mut clock);
    }
    p.run(&[]).ok();
    // Only one round inside: a later run's backups may land where an earlier
    // run kept a directory.
    let rounds = match how {
        How::Inside => &rounds[..1],
        _ => rounds,
    };
    let skip: &[&str] = match how {
        How::Inside => &[".old"],
        _ => &[],
    };
    for (round, edits) in rounds.iter().enumerate() {
        for &(side, op, seed) in edits {
            edit(if side == 0 { &p.a } else { &p.b }, op, seed, &mut clock);
        }
        let before = [state(&p.a, skip), state(&p.b, skip)];
        let dir = format!("../old{round}");
        let flags: Vec<&str> = match how {
            How::Versions => vec!["--force", "--versions"],
            How::Outside => vec!["--force", "--backup-dir", &dir],
            How::Inside => vec!["--force", "--backup-dir", ".old"],
        };
        let r = p.run_at(NOW + 100 * round as i64, &flags);
        if r.code != Some(0) {
            return Err(format!("round {round}: {r}"));
        }
        for (i, root) in [&p.a, &p.b].into_iter().enumerate() {
            let kept = match how {
                How::Versions => versions(root),
                How::Outside => kept_in(&root.parent().unwrap().join(format!("old{round}"))),
                How::Inside => kept_in(&root.join(".old")),
            };
            let lost = lost(&before[i], &state(root, skip), &kept);
            if !lost.is_empty() {
                return Err(format!(
                    "round {round}: side {} lost:\n  {}\n{r}",
                    ["A", "B"][i],
                    lost.join("\n  ")
                ));
            }
        }
        let (sa, sb) = (state(&p.a, skip), state(&p.b, skip));
        if sa != sb {
            return Err(format!(
                "round {round}: replicas differ\nA {sa:?}\nB {sb:?}\n{r}"
            ));
        }
    }
    Ok(())
}

fn config() -> ProptestConfig {
    let cases = std::env::var("FERRY_BISYNC_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    ProptestConfig {
        cases,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Every file and symlink version that existed on either side before a
    /// run is afterwards on that side or in its `.ferry-versions`, byte-equal.
    #[test]
    fn versions_keep_every_replaced_or_deleted_version(
        init in prop::collection::vec(any::<u64>(), 1..14),
        rounds in prop::collection::vec(prop::collection::vec((0u8..2, 0u8..7, any::<u64>()), 0..10), 1..4),
    ) {
        let r = keep_case(How::Versions, &init, &rounds);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    /// The same with `--backup-dir` relative to each replica, outside it
    /// (`../oldN`) or inside it (`.old`, never synced).
    #[test]
    fn backup_dirs_keep_every_replaced_or_deleted_version(
        inside in any::<bool>(),
        init in prop::collection::vec(any::<u64>(), 1..14),
        rounds in prop::collection::vec(prop::collection::vec((0u8..2, 0u8..7, any::<u64>()), 0..10), 1..4),
    ) {
        let how = if inside { How::Inside } else { How::Outside };
        let r = keep_case(how, &init, &rounds);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    /// A dry run that would keep changes nothing on either side (no
    /// `.ferry-versions` made) and says what it would keep.
    #[test]
    fn dry_run_changes_nothing(
        init in prop::collection::vec(any::<u64>(), 1..10),
        edits in prop::collection::vec((0u8..2, 0u8..7, any::<u64>()), 1..8),
    ) {
        let p = pair();
        let mut clock = 0;
        for &s in &init {
            edit(&p.a, [0, 5, 6][(s % 3) as usize], s, &mut clock);
        }
        p.run(&[]).ok();
        for &(side, op, seed) in &edits {
            edit(if side == 0 { &p.a } else { &p.b }, op, seed, &mut clock);
        }
        let before = (state(&p.a, &[]), state(&p.b, &[]));
        let dry = p.run(&["--force", "--versions", "--dry-run"]);
        prop_assert_eq!(dry.code, Some(0), "{}", dry);
        prop_assert_eq!(&before, &(state(&p.a, &[]), state(&p.b, &[])));
        prop_assert!(!p.a.join(VERSIONS).exists() && !p.b.join(VERSIONS).exists());
        // What the real run keeps is what the dry run said it would.
        let real = p.run(&["--force", "--versions"]);
        prop_assert_eq!(real.code, Some(0), "{}", real);
        let keeps = |r: &Run| {
            let mut v: Vec<String> = r.out().lines().filter(|l| l.starts_with("keep ")).map(str::to_owned).collect();
            v.sort();
            v
        };
        let mut kept: Vec<String> = Vec::new();
        for (side, root) in [("A", &p.a), ("B", &p.b)] {
            for (path, _) in versions(root) {
                kept.push(format!("{side} {path}"));
            }
        }
        kept.sort();
        let mut said: Vec<String> = keeps(&dry)
            .iter()
            .map(|l| l["keep ".len()..].split(" -> ").next().unwrap().to_owned())
            .collect();
        said.sort();
        prop_assert_eq!(said, kept);
    }
}

// ------------------------------------------------------------------------------------------
// Rules
// ------------------------------------------------------------------------------------------

/// A synced pair holding `f.txt` and `d/g`.
fn synced_pair() -> Pair {
    let p = pair();
    put(&p.a, "f.txt", b"old f", 1_600_000_000);
    put(&p.a, "d/g", b"old g", 1_600_000_000);
    p.run(&[]).ok();
    p
}

fn put(root: &Path, rel: &str, data: &[u8], mtime: i64) -> PathBuf {
    let p = write(root, rel, data);
    set_mtime(&p, (mtime, 0));
    p
}

#[test]
fn versions_stay_on_their_side_and_are_named_by_the_run() {
    let p = synced_pair();
    put(&p.a, "f.txt", b"new f", 1_600_000_100);
    fs::remove_file(p.b.join("d/g")).unwrap();
    let r = p.run(&["--versions", "--json"]);
    r.ok();
    // B's old f and A's g, each kept on its own side.
    assert_eq!(
        fs::read(p.b.join(".ferry-versions/f~20261125-163343.txt")).unwrap(),
        b"old f"
    );
    assert_eq!(
        fs::read(p.a.join(".ferry-versions/d/g~20261125-163343")).unwrap(),
        b"old g"
    );
    assert_eq!(fs::read(p.b.join("f.txt")).unwrap(), b"new f");
    assert!(!p.a.join("d/g").exists());
    // The records say what went where; the summary counts them.
    let out = r.out();
    assert!(
        out.contains(r#"{"type":"keep","side":"B","path":"f.txt","kept_to":".ferry-versions/f~20261125-163343.txt","size":5}"#),
        "{r}"
    );
    assert!(out.contains(r#""kept":2,"bytes_kept":10"#), "{r}");
    // A second run syncs nothing of either `.ferry-versions`.
    let r2 = p.run(&["--versions", "-v"]);
    r2.ok();
    assert!(
        !p.a.join(".ferry-versions/f~20261125-163343.txt").exists(),
        "{r2}"
    );
    assert!(!p.b.join(".ferry-versions/d").exists(), "{r2}");
    assert!(!r2.out().contains(".ferry-versions"), "{r2}");
}

#[test]
fn versions_dirs_are_never_synced_even_without_keeping() {
    let p = synced_pair();
    put(
        &p.a,
        ".ferry-versions/x~20260101-000000.txt",
        b"v",
        1_600_000_000,
    );
    put(&p.a, "d/.ferry-versions/y", b"w", 1_600_000_000);
    p.run(&[]).ok();
    assert!(!p.b.join(".ferry-versions").exists());
    assert!(!p.b.join("d/.ferry-versions").exists());
    // And never deleted: B deleting d's files leaves A's nested versions.
    fs::remove_dir_all(p.b.join("d")).unwrap();
    p.run(&[]).ok();
    assert_eq!(fs::read(p.a.join("d/.ferry-versions/y")).unwrap(), b"w");
    assert!(!p.a.join("d/g").exists());
}

#[test]
fn conflicts_still_keep_both() {
    let p = synced_pair();
    put(&p.a, "f.txt", b"A's f", 1_600_000_100);
    put(&p.b, "f.txt", b"B's f", 1_600_000_200);
    p.run(&["--versions"]).ok();
    for root in [&p.a, &p.b] {
        let s = state(root, &[]);
        let datas: Vec<&Node> = s.values().collect();
        assert!(datas.contains(&&Node::File(b"A's f".to_vec())), "{s:?}");
        assert!(datas.contains(&&Node::File(b"B's f".to_vec())), "{s:?}");
    }
    assert_eq!(state(&p.a, &[]), state(&p.b, &[]));
}

#[test]
fn a_failed_keep_leaves_the_entry_and_a_rerun_converges() {
    let p = synced_pair();
    put(&p.b, "f.txt", b"new f", 1_600_000_100);
    fs::remove_file(p.b.join("d/g")).unwrap();
    // A's versions directory cannot be made: a file holds its name.
    fs::write(p.a.join(VERSIONS), b"in the way").unwrap();
    let r = p.run(&["--versions"]);
    r.code_is(1);
    let errs = r.error_lines();
    assert_eq!(errs.len(), 2, "{r}");
    assert!(
        errs.iter()
            .any(|l| l.contains("f.txt") && l.contains("keep")),
        "{r}"
    );
    assert_eq!(fs::read(p.a.join("f.txt")).unwrap(), b"old f");
    assert_eq!(fs::read(p.a.join("d/g")).unwrap(), b"old g");
    // Not recorded as synced: the next run, the obstacle gone, does it.
    fs::remove_file(p.a.join(VERSIONS)).unwrap();
    p.run(&["--versions"]).ok();
    assert_eq!(fs::read(p.a.join("f.txt")).unwrap(), b"new f");
    assert!(!p.a.join("d/g").exists());
    let v = versions(&p.a);
    assert!(
        v.contains(&("f.txt".into(), Node::File(b"old f".to_vec()))),
        "{v:?}"
    );
    assert!(
        v.contains(&("d/g".into(), Node::File(b"old g".to_vec()))),
        "{v:?}"
    );
    assert_eq!(state(&p.a, &[]), state(&p.b, &[]));
}

#[test]
fn type_changes_and_symlinks_are_kept() {
    let p = synced_pair();
    std::os::unix::fs::symlink("somewhere", p.a.join("l")).unwrap();
    p.run(&[]).ok();
    // A: f.txt becomes a directory, l another link; B: d becomes a file.
    fs::remove_file(p.a.join("f.txt")).unwrap();
    put(&p.a, "f.txt/inside", b"in", 1_600_000_100);
    fs::remove_file(p.a.join("l")).unwrap();
    std::os::unix::fs::symlink("elsewhere", p.a.join("l")).unwrap();
    fs::remove_dir_all(p.b.join("d")).unwrap();
    put(&p.b, "d", b"d is a file", 1_600_000_100);
    p.run(&["--versions"]).ok();
    let (va, vb) = (versions(&p.a), versions(&p.b));
    assert!(
        vb.contains(&("f.txt".into(), Node::File(b"old f".to_vec()))),
        "{vb:?}"
    );
    assert!(
        vb.contains(&("l".into(), Node::Link(b"somewhere".to_vec()))),
        "{vb:?}"
    );
    assert!(
        va.contains(&("d/g".into(), Node::File(b"old g".to_vec()))),
        "{va:?}"
    );
    assert_eq!(state(&p.a, &[]), state(&p.b, &[]));
}

#[test]
fn backup_dirs_per_side() {
    let p = synced_pair();
    let (ka, kb) = (p.at("keep-a"), p.at("keep-b"));
    put(&p.a, "f.txt", b"new f", 1_600_000_100);
    fs::remove_file(p.a.join("d/g")).unwrap();
    put(&p.b, "h", b"h", 1_600_000_100);
    p.run(&[
        "--backup-dir1",
        ka.to_str().unwrap(),
        "--backup-dir2",
        kb.to_str().unwrap(),
        "--suffix",
        ".bak",
    ])
    .ok();
    assert_eq!(fs::read(kb.join("f.txt.bak")).unwrap(), b"old f");
    assert_eq!(fs::read(kb.join("d/g.bak")).unwrap(), b"old g");
    assert!(!ka.exists());
    // A relative --backup-dir is each replica's own; inside, it is never synced.
    put(&p.b, "f.txt", b"newer f", 1_600_000_200);
    p.run(&["--backup-dir", "old"]).ok();
    assert_eq!(fs::read(p.a.join("old/f.txt")).unwrap(), b"new f");
    assert!(!p.b.join("old").exists());
    assert_eq!(state(&p.a, &["old"]), state(&p.b, &["old"]));
}

#[test]
fn suffix_alone_keeps_beside_and_never_syncs_the_kept() {
    let p = synced_pair();
    put(&p.a, "f.txt", b"new f", 1_600_000_100);
    put(&p.b, "mine.bak", b"B's own backup", 1_600_000_100);
    p.run(&["--suffix", ".bak"]).ok();
    assert_eq!(fs::read(p.b.join("f.txt.bak")).unwrap(), b"old f");
    assert!(!p.a.join("f.txt.bak").exists());
    assert!(!p.a.join("mine.bak").exists());
    // Never deleted either: A's deletion of f.txt keeps B's backup.
    fs::remove_file(p.a.join("f.txt")).unwrap();
    p.run(&["-b", "--suffix", ".bak"]).ok();
    // A keep never replaces an older one: the next numbered name.
    assert_eq!(fs::read(p.b.join("f.txt.bak")).unwrap(), b"old f");
    assert_eq!(fs::read(p.b.join("f.txt.bak1.bak")).unwrap(), b"new f");
    assert_eq!(fs::read(p.b.join("mine.bak")).unwrap(), b"B's own backup");
}

#[test]
fn invalid_backup_dirs_are_refused_before_anything_changes() {
    let p = synced_pair();
    put(&p.a, "f.txt", b"new f", 1_600_000_100);
    let before = (state(&p.a, &[]), state(&p.b, &[]));
    let inside_b = p.b.join("keep");
    for flags in [
        vec!["--backup-dir1", inside_b.to_str().unwrap()],
        vec!["--backup-dir2", "s3://bucket/keep"],
        vec!["--backup-dir", "."],
    ] {
        let r = p.run(&flags);
        r.code_is(2);
        assert_eq!(r.err().lines().count(), 1, "{r}");
        assert_eq!(before, (state(&p.a, &[]), state(&p.b, &[])), "{r}");
    }
    // One directory for both sides: their kept files would overwrite each other.
    let shared = p.at("shared");
    let r = p.run(&["--backup-dir", shared.to_str().unwrap()]);
    r.code_is(2);
    assert!(r.err().contains("both A and B"), "{r}");
    assert!(!shared.exists());
    let r = p.run(&["--backup-dir2", "s3://bucket/keep"]);
    assert!(
        r.err().contains("--backup-dir2") && r.err().contains("B's backend"),
        "{r}"
    );
    // --versions keeps in each replica: no backup directory goes with it.
    p.run(&["--versions", "--backup-dir1", "x"]).code_is(2);
    assert_eq!(before, (state(&p.a, &[]), state(&p.b, &[])));
}

#[test]
fn watch_runs_keep_too() {
    let p = synced_pair();
    let mut c = Command::new(bin());
    c.env("FERRY_TEST_NOW", NOW.to_string())
        .arg("bisync")
        .arg("-v")
        .arg("--journal")
        .arg(&p.j)
        .args(["--watch", "--versions"])
        .arg(&p.a)
        .arg(&p.b);
    let mut w = crate::util::watch::Watch::spawn(c);
    // The first run ended (its summary, -v), then change A.
    w.line_with("ferry summary:");
    put(&p.a, "f.txt", b"watched f", 1_600_000_300);
    w.until("f.txt on B", || {
        fs::read(p.b.join("f.txt")).is_ok_and(|d| d == b"watched f")
    });
    w.kill();
    let vb = versions(&p.b);
    assert!(
        vb.contains(&("f.txt".into(), Node::File(b"old f".to_vec()))),
        "{vb:?}"
    );
}
