//! `ferry bisync`: one test per rule of the two-way sync contract (docs/CLI.md), a
//! model-based property test (random edits on both replicas between runs, checked
//! against the rules after every run) and kill -9 at random moments.
//!
//! (Over 800 lines: one test per rule of the bisync contract; the list is as long as the contract.)

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

use crate::util::*;
use proptest::prelude::{any, prop, proptest, ProptestConfig};

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// `ferry bisync --journal J [extra] A B`.
fn bisync(a: &Path, b: &Path, j: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<OsString> = vec!["bisync".into(), "--journal".into(), j.into()];
    args.extend(extra.iter().map(OsString::from));
    args.push(a.into());
    args.push(b.into());
    ferry(&args)
}

struct Pair {
    _t: tempfile::TempDir,
    a: PathBuf,
    b: PathBuf,
    j: PathBuf,
}

fn pair() -> Pair {
    let t = tmpdir();
    let (a, b, j) = (
        t.path().join("a"),
        t.path().join("b"),
        t.path().join("state/j.sqlite"),
    );
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    Pair { _t: t, a, b, j }
}

impl Pair {
    fn run(&self, extra: &[&str]) -> Run {
        bisync(&self.a, &self.b, &self.j, extra)
    }
}

/// Write a file with a given mtime (seconds).
fn put(root: &Path, rel: &str, data: &[u8], mtime: i64) -> PathBuf {
    let p = write(root, rel, data);
    set_mtime(&p, (mtime, 0));
    p
}

/// What a replica holds, for comparisons: files (bytes, mode, mtime), directories,
/// symlinks (target). Directory metadata is not part of the contract.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    File {
        data: Vec<u8>,
        mode: u32,
        mtime_ns: i128,
    },
    Dir,
    Link(OsString),
}

type State = BTreeMap<String, Node>;

fn state(root: &Path) -> State {
    let mut s = State::new();
    for rel in walk(root) {
        let p = root.join(&rel);
        let md = fs::symlink_metadata(&p).unwrap();
        let n = if md.file_type().is_symlink() {
            Node::Link(fs::read_link(&p).unwrap().into_os_string())
        } else if md.is_dir() {
            Node::Dir
        } else {
            Node::File {
                data: fs::read(&p).unwrap(),
                mode: md.mode() & 0o7777,
                mtime_ns: i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec()),
            }
        };
        s.insert(rel.to_string_lossy().into_owned(), n);
    }
    s
}

#[track_caller]
fn assert_replicas_equal(a: &Path, b: &Path) {
    let (sa, sb) = (state(a), state(b));
    if sa != sb {
        let mut d = Vec::new();
        for (k, v) in &sa {
            match sb.get(k) {
                None => d.push(format!("{k}: only in A")),
                Some(w) if w != v => d.push(format!("{k}: differs: A {v:?} / B {w:?}")),
                _ => {}
            }
        }
        for k in sb.keys().filter(|k| !sa.contains_key(*k)) {
            d.push(format!("{k}: only in B"));
        }
        panic!("replicas differ:\n  {}", d.join("\n  "));
    }
}

fn data(s: &State, p: &str) -> Option<Vec<u8>> {
    match s.get(p) {
        Some(Node::File { data, .. }) => Some(data.clone()),
        _ => None,
    }
}

/// Paths of conflict copies of `rel` (same directory, `stem (conflict ... from X).ext`).
fn conflict_copies(s: &State, rel: &str) -> Vec<String> {
    let (dir, name) = match rel.rfind('/') {
        Some(i) => (&rel[..=i], &rel[i + 1..]),
        None => ("", rel),
    };
    let stem = match name.rfind('.') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    };
    let prefix = format!("{dir}{stem} (conflict ");
    s.keys()
        .filter(|k| k.starts_with(&prefix) && !k[dir.len()..].contains('/'))
        .cloned()
        .collect()
}

/// Checks the rules of the contract for one run: `base` is what both replicas held after
/// the previous run, `a`/`b` what each held right before this one, `r` the result.
/// Returns the violations.
fn check_rules(base: &State, a: &State, b: &State, r: &State) -> Vec<String> {
    let mut bad = Vec::new();
    let file_in = |s: &State, p: &str| matches!(s.get(p), Some(Node::File { .. }));
    // 1. Every file content written since the last sync (new or changed at its path) is in
    //    the result at its path or at a conflict name of its path.
    for (side, s) in [("A", a), ("B", b)] {
        for (p, n) in s {
            let Node::File { data: d, .. } = n else {
                continue;
            };
            if base.get(p) == Some(n) {
                continue;
            }
            let here = data(r, p).as_ref() == Some(d);
            let aside = conflict_copies(r, p)
                .iter()
                .any(|c| data(r, c).as_ref() == Some(d));
            if !here && !aside {
                bad.push(format!("{side}'s new content of {p} is lost"));
            }
        }
    }
    for (p, n) in base {
        let Node::File { .. } = n else { continue };
        let (na, nb) = (a.get(p), b.get(p));
        let (ua, ub) = (na == Some(n), nb == Some(n));
        match (ua, ub) {
            // 2. Unchanged on both sides: still there.
            (true, true) if r.get(p) != Some(n) => {
                bad.push(format!("{p}: unchanged on both sides but not kept"))
            }
            // 3. Deleted on one side, unchanged on the other: deleted.
            (true, false) | (false, true) => {
                let (gone, other) = if ua { (nb, na) } else { (na, nb) };
                if gone.is_none() && file_in(r, p) && r.get(p) == other {
                    bad.push(format!(
                        "{p}: deleted on one side, unchanged on the other, but kept"
                    ));
                }
                // 4. Changed on one side (file to file), unchanged on the other: the
                //    change wins.
                if let Some(ch @ Node::File { .. }) = gone {
                    if r.get(p) != Some(ch) {
                        bad.push(format!(
                            "{p}: changed on one side only, change not propagated"
                        ));
                    }
                }
            }
            _ => {}
        }
        // 5. Deleted on one side, modified on the other: the modification wins.
        for (x, y) in [(na, nb), (nb, na)] {
            if x.is_none() {
                if let Some(m @ Node::File { .. }) = y {
                    if m != n && r.get(p) != Some(m) {
                        bad.push(format!("{p}: delete vs modify, modification lost"));
                    }
                }
            }
        }
    }
    bad
}

fn summary_field(r: &Run, key: &str) -> u64 {
    let last = json_lines(r)
        .into_iter()
        .rev()
        .find(|j| j.str_field("type") == Some("summary"))
        .unwrap_or_else(|| panic!("no summary line\n{r}"));
    last.get(key)
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("summary has no {key}\n{r}"))
}

// ------------------------------------------------------------------------------------------
// The rules, one by one
// ------------------------------------------------------------------------------------------

#[test]
fn first_run_merges_both_trees() {
    let p = pair();
    put(&p.a, "only_a.txt", b"from A", 1_600_000_000);
    put(&p.a, "sub/deep/a", b"deep A", 1_600_000_001);
    put(&p.b, "only_b.txt", b"from B", 1_600_000_002);
    put(&p.a, "same.txt", b"identical", 1_600_000_003);
    put(&p.b, "same.txt", b"identical", 1_600_000_003);
    fs::create_dir_all(p.b.join("empty/dir")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink("only_a.txt", p.a.join("link")).unwrap();
    // Both sides hold files and there is no journal yet: --resync says "merge them".
    let r = p.run(&["--json", "--resync"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 0, "{r}");
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    assert_eq!(data(&s, "only_b.txt").unwrap(), b"from B");
    assert_eq!(data(&s, "sub/deep/a").unwrap(), b"deep A");
    assert_eq!(s.get("empty/dir"), Some(&Node::Dir));
    assert_eq!(s.get("link"), Some(&Node::Link("only_a.txt".into())));
    // A second run has nothing to do, and writes nothing, not even to the journal.
    let journal = fs::read(&p.j).unwrap();
    let jmtime = fs::metadata(&p.j).unwrap().mtime_nsec();
    let before = (snapshot(&p.a), snapshot(&p.b));
    let r = p.run(&["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    assert_eq!(summary_field(&r, "files_deleted"), 0, "{r}");
    assert_untouched(&before.0, &snapshot(&p.a));
    assert_untouched(&before.1, &snapshot(&p.b));
    assert_eq!(fs::read(&p.j).unwrap(), journal);
    assert_eq!(fs::metadata(&p.j).unwrap().mtime_nsec(), jmtime);
    let wal = p.j.with_extension("sqlite-wal");
    assert!(
        fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "WAL written"
    );
}

#[test]
fn first_run_same_path_different_content_is_a_conflict() {
    let p = pair();
    put(&p.a, "report.txt", b"A's report", 1_600_000_000);
    put(&p.b, "report.txt", b"B's longer report", 1_600_000_100);
    let r = p.run(&["--json", "--resync"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 1, "{r}");
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    assert_eq!(data(&s, "report.txt").unwrap(), b"A's report");
    let c = conflict_copies(&s, "report.txt");
    assert_eq!(c.len(), 1, "{s:?}");
    assert_eq!(data(&s, &c[0]).unwrap(), b"B's longer report");
}

#[test]
fn conflict_keeps_both_with_documented_name() {
    let p = pair();
    put(&p.a, "docs/report.txt", b"v1", 1_600_000_000);
    p.run(&[]).ok();
    put(&p.a, "docs/report.txt", b"v2 from A", 1_600_000_100);
    put(&p.b, "docs/report.txt", b"v2 from B!", 1_600_000_200);
    let r = p.run(&["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 1, "{r}");
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.b);
    assert_eq!(data(&s, "docs/report.txt").unwrap(), b"v2 from A");
    let c = conflict_copies(&s, "docs/report.txt");
    assert_eq!(c.len(), 1);
    // docs/report (conflict YYYY-MM-DD HHMM from B).txt
    let name = c[0].strip_prefix("docs/report (conflict ").unwrap();
    let stamp = name
        .strip_suffix(" from B).txt")
        .unwrap_or_else(|| panic!("{name}"));
    let b = stamp.as_bytes();
    assert_eq!(b.len(), 15, "{stamp}");
    assert!(
        b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b' ',
            _ => c.is_ascii_digit(),
        }),
        "{stamp}"
    );
    assert_eq!(data(&s, &c[0]).unwrap(), b"v2 from B!");
    let conflicts: Vec<_> = json_lines(&r)
        .into_iter()
        .filter(|j| j.str_field("type") == Some("conflict"))
        .collect();
    assert_eq!(conflicts.len(), 1, "{r}");
    assert_eq!(conflicts[0].str_field("path"), Some("docs/report.txt"));
    // A later conflict on the same path gets another name.
    put(&p.a, "docs/report.txt", b"v3 from A", 1_600_000_300);
    put(&p.b, "docs/report.txt", b"v3 from B!", 1_600_000_400);
    p.run(&[]).ok();
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    let c = conflict_copies(&s, "docs/report.txt");
    assert_eq!(c.len(), 2, "{c:?}");
    let all: Vec<Vec<u8>> = c.iter().map(|k| data(&s, k).unwrap()).collect();
    assert!(all.contains(&b"v2 from B!".to_vec()) && all.contains(&b"v3 from B!".to_vec()));
}

#[test]
fn identical_change_on_both_sides_is_not_a_conflict() {
    let p = pair();
    put(&p.a, "f", b"old", 1_600_000_000);
    p.run(&[]).ok();
    put(&p.a, "f", b"the same new bytes", 1_600_000_100);
    put(&p.b, "f", b"the same new bytes", 1_600_000_200);
    let r = p.run(&["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 0, "{r}");
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    assert_replicas_equal(&p.a, &p.b);
    assert_eq!(state(&p.a).len(), 1);
}

#[test]
fn delete_on_one_side_modify_on_the_other_modification_wins() {
    let p = pair();
    put(&p.a, "x", b"x1", 1_600_000_000);
    put(&p.a, "y", b"y1", 1_600_000_000);
    p.run(&[]).ok();
    fs::remove_file(p.a.join("x")).unwrap();
    put(&p.b, "x", b"x2 from B", 1_600_000_100);
    put(&p.a, "y", b"y2 from A", 1_600_000_100);
    fs::remove_file(p.b.join("y")).unwrap();
    let r = p.run(&["--json", "--force"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 0, "{r}");
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    assert_eq!(data(&s, "x").unwrap(), b"x2 from B");
    assert_eq!(data(&s, "y").unwrap(), b"y2 from A");
}

#[test]
fn deletes_propagate_both_ways() {
    let p = pair();
    for i in 0..6 {
        put(&p.a, &format!("d/f{i}"), b"x", 1_600_000_000);
    }
    p.run(&[]).ok();
    fs::remove_file(p.a.join("d/f0")).unwrap();
    fs::remove_file(p.b.join("d/f1")).unwrap();
    p.run(&[]).ok();
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.b);
    assert!(!s.contains_key("d/f0") && !s.contains_key("d/f1"));
    assert_eq!(s.len(), 5);
}

#[test]
fn dir_deleted_on_one_side_new_files_inside_on_the_other_survive() {
    let p = pair();
    put(&p.a, "proj/old1", b"1", 1_600_000_000);
    put(&p.a, "proj/sub/old2", b"2", 1_600_000_000);
    put(&p.a, "keep", b"k", 1_600_000_000);
    p.run(&[]).ok();
    fs::remove_dir_all(p.a.join("proj")).unwrap();
    put(&p.b, "proj/sub/new", b"new file on B", 1_600_000_100);
    p.run(&["--force"]).ok();
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    assert_eq!(data(&s, "proj/sub/new").unwrap(), b"new file on B");
    assert!(!s.contains_key("proj/old1") && !s.contains_key("proj/sub/old2"));
}

#[test]
fn type_changes_propagate() {
    let p = pair();
    put(&p.a, "was_file", b"f", 1_600_000_000);
    put(&p.a, "was_dir/inner", b"i", 1_600_000_000);
    put(&p.a, "pad1", b"p", 1_600_000_000);
    put(&p.a, "pad2", b"p", 1_600_000_000);
    p.run(&[]).ok();
    fs::remove_file(p.a.join("was_file")).unwrap();
    put(&p.a, "was_file/now_inside", b"n", 1_600_000_100);
    fs::remove_dir_all(p.b.join("was_dir")).unwrap();
    put(&p.b, "was_dir", b"now a file", 1_600_000_100);
    p.run(&["--force"]).ok();
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    assert_eq!(data(&s, "was_file/now_inside").unwrap(), b"n");
    assert_eq!(data(&s, "was_dir").unwrap(), b"now a file");
}

#[test]
fn rename_is_replayed_as_a_rename() {
    let p = pair();
    let big = gen_bytes(200_000, 7);
    put(&p.a, "photos/img.raw", &big, 1_600_000_000);
    put(&p.a, "other", b"o", 1_600_000_000);
    p.run(&[]).ok();
    let ino_b = fs::metadata(p.b.join("photos/img.raw")).unwrap().ino();
    fs::create_dir(p.a.join("album")).unwrap();
    fs::rename(p.a.join("photos/img.raw"), p.a.join("album/renamed.raw")).unwrap();
    let r = p.run(&["--json"]);
    r.ok();
    assert_replicas_equal(&p.a, &p.b);
    // Same inode on B: moved, not copied.
    assert_eq!(
        fs::metadata(p.b.join("album/renamed.raw")).unwrap().ino(),
        ino_b
    );
    assert_eq!(summary_field(&r, "renamed"), 1, "{r}");
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    assert_eq!(summary_field(&r, "bytes_copied"), 0, "{r}");
    let ren: Vec<_> = json_lines(&r)
        .into_iter()
        .filter(|j| j.str_field("type") == Some("rename"))
        .collect();
    assert_eq!(ren.len(), 1, "{r}");
    assert_eq!(ren[0].str_field("from"), Some("photos/img.raw"));
    assert_eq!(ren[0].str_field("side"), Some("B"));
}

#[test]
fn rename_on_b_when_a_modified_the_old_path_keeps_both() {
    let p = pair();
    put(&p.a, "f", b"v1", 1_600_000_000);
    put(&p.a, "pad", b"p", 1_600_000_000);
    p.run(&[]).ok();
    fs::rename(p.b.join("f"), p.b.join("g")).unwrap();
    put(&p.a, "f", b"v2 on A", 1_600_000_100);
    p.run(&[]).ok();
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    assert_eq!(data(&s, "f").unwrap(), b"v2 on A");
    assert_eq!(data(&s, "g").unwrap(), b"v1");
}

#[test]
fn deletion_limit_refuses_without_force() {
    let p = pair();
    for i in 0..10 {
        put(&p.a, &format!("f{i}"), b"data", 1_600_000_000);
    }
    p.run(&[]).ok();
    for i in 0..6 {
        fs::remove_file(p.a.join(format!("f{i}"))).unwrap();
    }
    let before = (snapshot(&p.a), snapshot(&p.b));
    let r = p.run(&[]);
    r.code_is(2);
    assert!(r.err().contains("--force"), "{r}");
    assert!(r.err().contains("6 of 10"), "{r}");
    assert_untouched(&before.0, &snapshot(&p.a));
    assert_untouched(&before.1, &snapshot(&p.b));
    // A higher limit, or --force, lets it through.
    p.run(&["--max-delete", "60"]).ok();
    assert_replicas_equal(&p.a, &p.b);
    assert_eq!(state(&p.b).len(), 4);
    for i in 6..10 {
        fs::remove_file(p.b.join(format!("f{i}"))).unwrap();
    }
    p.run(&[]).code_is(2);
    p.run(&["--force"]).ok();
    assert!(state(&p.a).is_empty());
}

#[test]
fn dry_run_changes_nothing_and_shows_every_action() {
    let p = pair();
    put(&p.a, "a1", b"a1", 1_600_000_000);
    put(&p.a, "gone", b"g", 1_600_000_000);
    put(&p.a, "c", b"c", 1_600_000_000);
    put(&p.a, "pad1", b"p", 1_600_000_000);
    put(&p.a, "pad2", b"p", 1_600_000_000);
    p.run(&[]).ok();
    put(&p.a, "new_a", b"n", 1_600_000_100);
    put(&p.b, "new_b", b"n", 1_600_000_100);
    fs::remove_file(p.b.join("gone")).unwrap();
    put(&p.a, "c", b"c from A", 1_600_000_100);
    put(&p.b, "c", b"c from B!", 1_600_000_200);
    let journal = fs::read(&p.j).unwrap();
    let before = (snapshot(&p.a), snapshot(&p.b));
    let r = p.run(&["--dry-run", "--json"]);
    r.ok();
    assert_untouched(&before.0, &snapshot(&p.a));
    assert_untouched(&before.1, &snapshot(&p.b));
    assert_eq!(fs::read(&p.j).unwrap(), journal);
    let acts: Vec<(String, String, String)> = json_lines(&r)
        .into_iter()
        .filter(|j| j.str_field("type") != Some("summary"))
        .map(|j| {
            (
                j.str_field("type").unwrap().to_string(),
                j.str_field("side").unwrap_or("").to_string(),
                j.str_field("path").unwrap().to_string(),
            )
        })
        .collect();
    for want in [
        ("copy", "B", "new_a"),
        ("copy", "A", "new_b"),
        ("delete", "A", "gone"),
        ("conflict", "B", "c"),
    ] {
        assert!(
            acts.iter()
                .any(|(t, s, p)| (t.as_str(), s.as_str(), p.as_str()) == want),
            "{want:?} missing\n{r}"
        );
    }
    // Without a journal file a dry run creates none.
    let q = pair();
    put(&q.a, "x", b"x", 1_600_000_000);
    q.run(&["-n"]).ok();
    assert!(!q.j.exists());
    assert!(state(&q.b).is_empty());
}

#[test]
fn resync_merges_again_and_missing_journal_loses_nothing() {
    let p = pair();
    put(&p.a, "f", b"v1", 1_600_000_000);
    put(&p.a, "g", b"g", 1_600_000_000);
    p.run(&[]).ok();
    // Without the journal, a deletion cannot be told from a creation: the file comes back.
    fs::remove_file(p.a.join("g")).unwrap();
    put(&p.b, "f", b"v2 from B", 1_600_000_100);
    let r = p.run(&["--resync", "--json"]);
    r.ok();
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    assert_eq!(data(&s, "g").unwrap(), b"g");
    // Different content without a journal: both kept.
    assert_eq!(summary_field(&r, "conflicts"), 1, "{r}");
    assert_eq!(data(&s, "f").unwrap(), b"v1");
    // A deleted journal with both sides holding files: refused (see
    // lost_journal_with_both_sides_non_empty_needs_resync); --resync merges.
    fs::remove_file(&p.j).unwrap();
    p.run(&["--json"]).code_is(2);
    let r = p.run(&["--json", "--resync"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 0, "{r}");
    assert_replicas_equal(&p.a, &p.b);
}

#[test]
fn default_journal_location_and_lock() {
    let p = pair();
    let state_home = p.a.parent().unwrap().join("xdg");
    put(&p.a, "f", b"f", 1_600_000_000);
    let run = |extra: &[&str]| {
        let out = Command::new(bin())
            .arg("bisync")
            .args(extra)
            .arg(&p.a)
            .arg(&p.b)
            .env("XDG_STATE_HOME", &state_home)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(run(&[]).0, Some(0));
    let dir = state_home.join("ferry/bisync");
    let files: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sqlite"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let journal = dir.join(&files[0]);
    // The swapped pair is another pair (another journal: a first run, so --resync).
    let out = Command::new(bin())
        .arg("bisync")
        .arg("--resync")
        .arg(&p.b)
        .arg(&p.a)
        .env("XDG_STATE_HOME", &state_home)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    // A held lock: exit 2, nothing done.
    put(&p.a, "g", b"g", 1_600_000_000);
    let mut lock = journal.as_os_str().to_owned();
    lock.push(".lock");
    // --no-fork: `sleep` itself holds the lock, so killing it releases it.
    let mut holder = Command::new("flock")
        .arg("--no-fork")
        .arg("-x")
        .arg(&lock)
        .arg("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    // Held once another taker is refused (no fixed sleep: flock may take
    // its time to start on a loaded machine).
    let held = || {
        Command::new("flock")
            .args(["-n", "-x"])
            .arg(&lock)
            .arg("true")
            .status()
            .is_ok_and(|s| !s.success())
    };
    let start = std::time::Instant::now();
    while !held() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "flock never took the lock"
        );
        sleep(Duration::from_millis(10));
    }
    let (code, err) = run(&[]);
    holder.kill().unwrap();
    let _ = holder.wait();
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("another bisync"), "{err}");
    assert!(!p.b.join("g").exists());
    assert_eq!(run(&[]).0, Some(0));
    assert!(p.b.join("g").exists());
    // A journal of another pair is refused.
    let q = pair();
    let out = Command::new(bin())
        .arg("bisync")
        .arg("--journal")
        .arg(&journal)
        .arg(&q.a)
        .arg(&q.b)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("belongs to"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let p = pair();
    ferry(["bisync", p.a.to_str().unwrap()]).code_is(2);
    let inside = p.a.join("inner");
    fs::create_dir(&inside).unwrap();
    bisync(&p.a, &inside, &p.j, &[]).code_is(2);
    bisync(&p.a, &p.a, &p.j, &[]).code_is(2);
    let f = put(&p.a, "file", b"x", 1);
    bisync(&f, &p.b, &p.j, &[]).code_is(2);
    bisync(&p.a, &p.b, &p.j, &["--max-delete", "101"]).code_is(2);
    bisync(&p.a, &p.b, &p.j, &["--bogus"]).code_is(2);
}

#[test]
fn per_file_failure_exits_1_and_the_rest_is_done() {
    let p = pair();
    put(&p.a, "d/stuck", b"s", 1_600_000_000);
    put(&p.a, "pad1", b"p", 1_600_000_000);
    put(&p.a, "pad2", b"p", 1_600_000_000);
    p.run(&[]).ok();
    fs::remove_file(p.a.join("d/stuck")).unwrap();
    put(&p.a, "new", b"n", 1_600_000_100);
    // An immutable directory: B's `stuck` cannot be removed. (The file's
    // own flag would move its change time: a change that wins over A's
    // deletion.)
    let Some(_g) = Immutable::try_set(&p.b.join("d")) else {
        eprintln!("SKIP: chattr +i does not work here");
        return;
    };
    let r = p.run(&["--json"]);
    r.code_is(1);
    let errs = r.error_lines();
    assert!(errs.iter().any(|l| l.contains("stuck: ")), "{r}");
    assert_eq!(summary_field(&r, "errors"), 1, "{r}");
    assert!(p.b.join("new").exists());
    drop(_g);
    // The journal still knows `stuck`: the next run deletes it.
    p.run(&[]).ok();
    assert_replicas_equal(&p.a, &p.b);
}

#[test]
fn mode_change_propagates() {
    let p = pair();
    put(&p.a, "script", b"#!/bin/sh\n", 1_600_000_000);
    chmod(&p.a.join("script"), 0o644);
    p.run(&[]).ok();
    chmod(&p.b.join("script"), 0o755);
    p.run(&[]).ok();
    assert_replicas_equal(&p.a, &p.b);
    assert_eq!(
        fs::metadata(p.a.join("script")).unwrap().mode() & 0o777,
        0o755
    );
}

#[test]
fn excluded_entries_are_left_alone() {
    let p = pair();
    put(&p.a, "keep.txt", b"k", 1_600_000_000);
    put(&p.a, "cache/big.tmp", b"t", 1_600_000_000);
    let r = p.run(&["--exclude", "*.tmp"]);
    r.ok();
    assert!(!p.b.join("cache/big.tmp").exists());
    assert!(p.b.join("keep.txt").exists());
}

// ------------------------------------------------------------------------------------------
// Missing and empty roots, lost journals (issue 11, items 1 and 3)
// ------------------------------------------------------------------------------------------

/// A replica the journal has seen is never created again: gone (an unmounted disk, a
/// renamed folder), the run is refused with one line naming it, exit 2, nothing created
/// or deleted, and --force does not change that; only --resync does.
#[test]
fn missing_root_seen_before_is_refused_even_with_force() {
    let p = pair();
    for i in 0..3 {
        put(&p.a, &format!("f{i}"), b"data", 1_600_000_000);
    }
    p.run(&[]).ok();
    for (root, other, side) in [(&p.a, &p.b, "A"), (&p.b, &p.a, "B")] {
        let away = root.with_extension("away");
        fs::rename(root, &away).unwrap();
        let before = snapshot(other);
        let journal = fs::read(&p.j).unwrap();
        for extra in [
            &[][..],
            &["--force"],
            &["--force", "--max-delete", "100"],
            &["-n"],
        ] {
            let r = p.run(extra);
            r.code_is(2);
            let err = r.err();
            assert_eq!(err.lines().count(), 1, "{extra:?}\n{r}");
            let want = format!("ferry: {side} {}: does not exist", root.display());
            assert!(err.starts_with(&want), "{extra:?}\n{r}");
            assert!(err.contains("--resync"), "{r}");
            assert!(!root.exists(), "{side} was created\n{r}");
            assert_untouched(&before, &snapshot(other));
            assert_eq!(fs::read(&p.j).unwrap(), journal);
        }
        fs::rename(&away, root).unwrap();
        let r = p.run(&["--json"]);
        r.ok();
        assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    }
    // After checking, --resync syncs the missing side as a new one.
    let away = p.b.with_extension("away");
    fs::rename(&p.b, &away).unwrap();
    let r = p.run(&["--resync"]);
    r.ok();
    assert!(r.err().contains("created B"), "{r}");
    assert_replicas_equal(&p.a, &p.b);
    assert_eq!(state(&p.b).len(), 3);
}

/// A replica that exists but is empty while the journal knew files (an unmounted mount
/// point) is refused unless --force, with a message saying so; --force deletes on the
/// other side.
#[test]
fn empty_root_seen_with_files_is_refused_unless_force() {
    let p = pair();
    for i in 0..3 {
        put(&p.a, &format!("d/f{i}"), b"data", 1_600_000_000);
    }
    p.run(&[]).ok();
    let away = p.a.with_extension("away");
    fs::rename(&p.a, &away).unwrap();
    fs::create_dir(&p.a).unwrap();
    let before = snapshot(&p.b);
    for extra in [&[][..], &["--max-delete", "100"], &["-n"]] {
        let r = p.run(extra);
        r.code_is(2);
        let err = r.err();
        assert_eq!(err.lines().count(), 1, "{r}");
        let want = format!(
            "ferry: A {} is empty, but held 3 files and 1 directory at the last run",
            p.a.display()
        );
        assert!(err.starts_with(&want), "{r}");
        assert!(
            err.contains(
                "mount it, or run again with --force to delete 3 files and 1 directory on B"
            ),
            "{r}"
        );
        assert_untouched(&before, &snapshot(&p.b));
        assert!(state(&p.a).is_empty());
    }
    // Mounted again: nothing to do.
    fs::remove_dir(&p.a).unwrap();
    fs::rename(&away, &p.a).unwrap();
    p.run(&[]).ok();
    assert_eq!(state(&p.b).len(), 4);
    // Really emptied on purpose: --force.
    fs::remove_dir_all(p.a.join("d")).unwrap();
    p.run(&[]).code_is(2);
    p.run(&["--force"]).ok();
    assert!(state(&p.b).is_empty());
    // An empty side whose partner has nothing unchanged to lose is no reason to refuse.
    put(&p.a, "x", b"x", 1_600_000_000);
    p.run(&[]).ok();
    fs::remove_file(p.b.join("x")).unwrap();
    put(&p.a, "x", b"x changed", 1_600_000_100);
    p.run(&[]).ok();
    assert_eq!(data(&state(&p.b), "x").unwrap(), b"x changed");
}

/// A first run creates a missing replica, with the other root's mode, and says so; the
/// dry run says exactly what the real run does, without creating it.
#[test]
fn first_run_creates_a_missing_side_and_the_dry_run_says_so() {
    let p = pair();
    put(&p.a, "f", b"hello", 1_600_000_000);
    put(&p.a, "sub/g", b"world!", 1_600_000_000);
    chmod(&p.a, 0o750);
    fs::remove_dir(&p.b).unwrap();
    let dry = p.run(&["-n", "--json"]);
    dry.ok();
    assert!(!p.b.exists(), "the dry run created B");
    assert!(!p.j.exists(), "the dry run created the journal");
    let want = format!("ferry: would create B {} (does not exist)", p.b.display());
    assert!(dry.err().contains(&want), "{dry}");
    let real = p.run(&["--json"]);
    real.ok();
    let want = format!("ferry: created B {} (did not exist)", p.b.display());
    assert!(real.err().contains(&want), "{real}");
    assert_eq!(fs::metadata(&p.b).unwrap().mode() & 0o7777, 0o750);
    assert_replicas_equal(&p.a, &p.b);
    assert_eq!(actions(&dry), actions(&real));
    assert!(actions(&real).contains(&("mkdir".into(), "B".into(), ".".into(), 0)));
    for k in SUMMARY_COUNTS {
        assert_eq!(
            summary_field(&dry, k),
            summary_field(&real, k),
            "{k}\n{dry}\n{real}"
        );
    }
    assert_eq!(summary_field(&real, "dirs_created"), 2, "{real}");
    // Neither side: refused.
    let q = pair();
    fs::remove_dir(&q.a).unwrap();
    fs::remove_dir(&q.b).unwrap();
    q.run(&[]).code_is(2);
    assert!(!q.a.exists() && !q.b.exists());
}

/// No journal (deleted, or never made) and both sides hold files: refused until
/// --resync, with a message saying why, since a deletion made since the last run would
/// come back. A first run with one side empty goes ahead.
#[test]
fn lost_journal_with_both_sides_non_empty_needs_resync() {
    let p = pair();
    put(&p.a, "keep", b"k", 1_600_000_000);
    put(&p.a, "gone", b"g", 1_600_000_000);
    p.run(&[]).ok();
    fs::remove_file(p.a.join("gone")).unwrap();
    lose_journal(&p.j);
    let before = (snapshot(&p.a), snapshot(&p.b));
    for extra in [&[][..], &["--force"], &["-n"]] {
        let r = p.run(extra);
        r.code_is(2);
        let err = r.err();
        assert_eq!(err.lines().count(), 1, "{r}");
        assert!(err.contains("no journal"), "{r}");
        assert!(err.contains("deleted files would come back"), "{r}");
        assert!(err.contains("--resync"), "{r}");
        assert_untouched(&before.0, &snapshot(&p.a));
        assert_untouched(&before.1, &snapshot(&p.b));
    }
    // A refused run leaves no journal that a later run could take for a real one.
    p.run(&[]).code_is(2);
    p.run(&["--resync"]).ok();
    assert_replicas_equal(&p.a, &p.b);
    assert_eq!(data(&state(&p.a), "gone").unwrap(), b"g");
    // Later runs use the new journal.
    fs::remove_file(p.a.join("gone")).unwrap();
    p.run(&[]).ok();
    assert!(!p.b.join("gone").exists());
}

// ------------------------------------------------------------------------------------------
// Renames proven by content, --checksum (issue 11, item 2)
// ------------------------------------------------------------------------------------------

/// The reproduction: a deleted file's inode reused by a new file with the same
/// size and mtime is not a rename.
#[test]
fn inode_reuse_is_not_taken_for_a_rename() {
    let p = pair();
    put(&p.a, "pad", b"p", 1_600_000_000);
    put(&p.a, "h", b"AAAA\n", 1);
    p.run(&[]).ok();
    let ino = fs::metadata(p.a.join("h")).unwrap().ino();
    fs::remove_file(p.a.join("h")).unwrap();
    put(&p.a, "k", b"BBBB\n", 1);
    let reused = fs::metadata(p.a.join("k")).unwrap().ino() == ino;
    let r = p.run(&["--json"]);
    r.ok();
    assert_eq!(
        fs::read(p.b.join("k")).unwrap(),
        b"BBBB\n",
        "inode reused: {reused}\n{r}"
    );
    assert!(!p.b.join("h").exists());
    assert_eq!(summary_field(&r, "renamed"), 0, "{r}");
    assert_replicas_equal(&p.a, &p.b);
    // Whatever the file system does with inodes: the same inode with new bytes (what
    // reuse amounts to), moved to a new name.
    put(&p.a, "m", b"CCCC\n", 2);
    p.run(&[]).ok();
    rewrite_keep_meta(&p.a.join("m"), b"DDDD\n");
    fs::rename(p.a.join("m"), p.a.join("n")).unwrap();
    let r = p.run(&["--json"]);
    r.ok();
    assert_eq!(fs::read(p.b.join("n")).unwrap(), b"DDDD\n", "{r}");
    assert!(!p.b.join("m").exists());
    assert_eq!(summary_field(&r, "renamed"), 0, "{r}");
    let r = p.run(&["--json"]);
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    assert_replicas_equal(&p.a, &p.b);
}

/// A change that kept size and mtime is seen by its change time (recorded
/// in the journal), without `-c`: copied to the other side.
#[test]
fn a_change_that_kept_size_and_mtime_is_seen_by_its_ctime() {
    let p = pair();
    put(&p.a, "f", b"original", 1_600_000_000);
    put(&p.a, "same", b"same", 1_600_000_000);
    p.run(&[]).ok();
    rewrite_keep_meta(&p.a.join("f"), b"ORIGINAL");
    let r = p.run(&["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 1, "{r}");
    assert_eq!(fs::read(p.b.join("f")).unwrap(), b"ORIGINAL", "{r}");
    assert_replicas_equal(&p.a, &p.b);
    let r = p.run(&["-c", "--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    assert_eq!(summary_field(&r, "conflicts"), 0, "{r}");
}

/// Make the journal at `j` one of format 2, as a ferry before change times
/// wrote it: each record without its two change times.
fn forget_ctimes(j: &Path) {
    const SIDE: usize = 8 + 8 + 4 + 8 + 8;
    let c = rusqlite::Connection::open(j).unwrap();
    let rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = c
        .prepare("SELECT dir, first, data FROM chunks")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (dir, first, data) in rows {
        let (mut d, mut out) = (&data[..], Vec::new());
        while !d.is_empty() {
            let n = u16::from_le_bytes([d[0], d[1]]) as usize;
            out.extend_from_slice(&d[..2 + n + 1]);
            let sides = &d[2 + n + 1..2 + n + 1 + 2 * SIDE];
            for side in sides.chunks(SIDE) {
                out.extend_from_slice(&side[..SIDE - 8]);
            }
            d = &d[2 + n + 1 + 2 * SIDE..];
        }
        c.execute(
            "UPDATE chunks SET data = ?3 WHERE dir = ?1 AND first = ?2",
            rusqlite::params![dir, first, out],
        )
        .unwrap();
    }
    c.execute("UPDATE meta SET v = '2' WHERE k = 'version'", [])
        .unwrap();
}

/// `--checksum`: files that the metadata call in sync have their bytes
/// compared; a difference no metadata shows (here: a journal written
/// before change times were kept, format 2, and a change that kept size
/// and mtime) is a conflict, both versions kept.
#[test]
fn checksum_finds_changes_that_kept_size_and_mtime() {
    let p = pair();
    put(&p.a, "f", b"original", 1_600_000_000);
    put(&p.a, "same", b"same", 1_600_000_000);
    p.run(&[]).ok();
    rewrite_keep_meta(&p.a.join("f"), b"ORIGINAL");
    forget_ctimes(&p.j);
    let r = p.run(&["-n", "--json"]);
    r.ok();
    assert_eq!(
        summary_field(&r, "files_copied"),
        0,
        "without -c nothing is seen\n{r}"
    );
    let r = p.run(&["-c", "-n", "--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 1, "{r}");
    let r = p.run(&["--checksum", "--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 1, "{r}");
    assert_eq!(summary_field(&r, "unchanged"), 1, "{r}");
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    assert_eq!(data(&s, "f").unwrap(), b"ORIGINAL");
    let c = conflict_copies(&s, "f");
    assert_eq!(c.len(), 1, "{s:?}");
    assert_eq!(data(&s, &c[0]).unwrap(), b"original");
    let r = p.run(&["-c", "--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 0, "{r}");
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
}

/// A first run (`--resync`) takes two files of the same size and mtime to be equal, as
/// sync's quick check does, without reading them; the same size with another mtime has
/// its bytes compared (equal: in sync, the newer mtime applied to both; different: a
/// conflict); `--checksum` compares every pair.
#[test]
fn first_run_trusts_size_and_mtime_and_compares_the_rest() {
    let p = pair();
    put(&p.a, "quick", b"aaaa", 1_600_000_000);
    put(&p.b, "quick", b"bbbb", 1_600_000_000);
    put(&p.a, "same", b"same", 1_600_000_000);
    put(&p.b, "same", b"same", 1_600_000_500);
    put(&p.a, "differ", b"xxxx", 1_600_000_000);
    put(&p.b, "differ", b"yyyy", 1_600_000_500);
    let r = p.run(&["--resync", "-c", "-n", "--json"]);
    r.ok();
    assert_eq!(
        summary_field(&r, "conflicts"),
        2,
        "-c: quick and differ\n{r}"
    );
    let r = p.run(&["--resync", "--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 1, "differ only\n{r}");
    let (a, b) = (state(&p.a), state(&p.b));
    assert_eq!(data(&a, "quick").unwrap(), b"aaaa");
    assert_eq!(data(&b, "quick").unwrap(), b"bbbb");
    for s in [&a, &b] {
        assert_eq!(data(s, "same").unwrap(), b"same");
        assert_eq!(conflict_copies(s, "differ").len(), 1, "{s:?}");
    }
    assert_eq!(
        fs::metadata(p.a.join("same")).unwrap().mtime(),
        1_600_000_500,
        "the newer mtime wins"
    );
    let r = p.run(&["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    assert_eq!(summary_field(&r, "conflicts"), 0, "{r}");
}

// ------------------------------------------------------------------------------------------
// Output that cannot lie (issue 11)
// ------------------------------------------------------------------------------------------

const SUMMARY_COUNTS: [&str; 8] = [
    "files_copied",
    "bytes_copied",
    "files_deleted",
    "dirs_created",
    "renamed",
    "conflicts",
    "unchanged",
    "errors",
];

/// The actions of a `--json` run (type, side, path, size), sorted; conflict names with
/// their stamp blanked (a dry run and the real run may fall in different minutes).
fn actions(r: &Run) -> Vec<(String, String, String, u64)> {
    let blank = |s: &str| match s.find("(conflict ") {
        Some(i) => format!("{}(conflict STAMP{}", &s[..i], &s[i + 25..]),
        None => s.to_string(),
    };
    let mut v: Vec<_> = json_lines(r)
        .into_iter()
        .filter(|j| j.str_field("type") != Some("summary"))
        .map(|j| {
            (
                j.str_field("type").unwrap().to_string(),
                j.str_field("side").unwrap_or("").to_string(),
                blank(j.str_field("path").unwrap()),
                j.get("size").and_then(|v| v.as_u64()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// `bisync -n` reports every action the real run takes (conflicts are three: the
/// version moved aside and a copy each way), with real sizes, and the same counts.
#[test]
fn dry_run_reports_what_the_real_run_does() {
    let p = pair();
    put(&p.a, "c.txt", b"c", 1_600_000_000);
    put(&p.a, "gone", b"gone!", 1_600_000_000);
    put(&p.a, "moved", &gen_bytes(3000, 1), 1_600_000_000);
    put(&p.a, "dir/inner", b"i", 1_600_000_000);
    put(&p.a, "file_to_dir", b"f", 1_600_000_000);
    for i in 0..8 {
        put(&p.a, &format!("pad/{i}"), b"p", 1_600_000_000);
    }
    p.run(&[]).ok();
    put(&p.a, "c.txt", b"c from A", 1_600_000_100);
    put(&p.b, "c.txt", b"c from B!!", 1_600_000_200);
    put(&p.a, "new_a", b"new on A", 1_600_000_100);
    put(&p.b, "new_b", b"new on B..", 1_600_000_100);
    fs::remove_file(p.b.join("gone")).unwrap();
    fs::rename(p.a.join("moved"), p.a.join("moved2")).unwrap();
    fs::remove_dir_all(p.b.join("dir")).unwrap();
    put(&p.b, "dir", b"now a file", 1_600_000_100);
    fs::remove_file(p.a.join("file_to_dir")).unwrap();
    put(&p.a, "file_to_dir/x", b"x", 1_600_000_100);
    chmod(&p.a.join("pad/0"), 0o600);
    let dry = p.run(&["-n", "--json"]);
    dry.ok();
    let real = p.run(&["--json"]);
    real.ok();
    assert_replicas_equal(&p.a, &p.b);
    let (da, ra) = (actions(&dry), actions(&real));
    assert_eq!(da, ra, "\n{dry}\n{real}");
    let has = |t: &str, side: &str, path: &str, size: u64| {
        ra.contains(&(t.into(), side.into(), path.into(), size))
    };
    assert!(has("conflict", "B", "c.txt", 10), "{real}");
    assert!(
        has("copy", "A", "c (conflict STAMP from B).txt", 10),
        "{real}"
    );
    assert!(has("copy", "B", "c.txt", 8), "{real}");
    assert!(has("delete", "A", "gone", 5), "{real}");
    assert!(has("rename", "B", "moved2", 3000), "{real}");
    for k in SUMMARY_COUNTS {
        assert_eq!(
            summary_field(&dry, k),
            summary_field(&real, k),
            "{k}\n{dry}\n{real}"
        );
    }
}

/// A conflict on a name near NAME_MAX gets a conflict name that fits (stem shortened,
/// extension and stamp kept), instead of failing every run.
#[test]
fn conflict_on_a_long_name_fits_name_max() {
    let p = pair();
    let name = format!("{}.txt", "é".repeat(124)); // 252 bytes
    put(&p.a, &name, b"v1", 1_600_000_000);
    p.run(&[]).ok();
    put(&p.a, &name, b"v2 from A", 1_600_000_100);
    put(&p.b, &name, b"v2 from B!", 1_600_000_200);
    let r = p.run(&["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 1, "{r}");
    assert_replicas_equal(&p.a, &p.b);
    let s = state(&p.a);
    let others: Vec<&String> = s.keys().filter(|k| **k != name).collect();
    assert_eq!(others.len(), 1, "{s:?}");
    let c = others[0];
    assert!(c.len() <= 255, "{}", c.len());
    assert!(c.starts_with("éé") && c.ends_with(" from B).txt"), "{c}");
    assert_eq!(data(&s, c).unwrap(), b"v2 from B!");
    p.run(&[]).ok();
}

/// Summaries say "1 conflict", "1 dir created", "1 error".
#[test]
fn summary_counts_are_pluralised() {
    let p = pair();
    put(&p.a, "f", b"v1", 1_600_000_000);
    p.run(&[]).ok();
    put(&p.a, "f", b"v2 from A", 1_600_000_100);
    put(&p.b, "f", b"v2 from B!", 1_600_000_200);
    fs::create_dir(p.a.join("d")).unwrap();
    let r = p.run(&[]);
    r.ok();
    let line = r
        .err()
        .lines()
        .find(|l| l.starts_with("ferry summary:"))
        .unwrap()
        .to_string();
    assert!(line.contains(", 1 conflict,"), "{line}");
    assert!(line.contains(" 1 dir created"), "{line}");
    assert!(line.contains(" 0 errors"), "{line}");
    assert!(line.contains(" 0 renamed"), "{line}");
}

/// A special file is skipped with a note naming its side and the real reason, and its
/// path is left alone on both sides (not taken for a deletion).
#[test]
fn special_file_skip_names_its_side_and_reason() {
    let p = pair();
    put(&p.a, "p", b"a file", 1_600_000_000);
    put(&p.a, "pad", b"x", 1_600_000_000);
    put(&p.a, "pad2", b"x", 1_600_000_000);
    p.run(&[]).ok();
    mkfifo(&p.a.join("fifo"));
    fs::remove_file(p.a.join("p")).unwrap();
    mkfifo(&p.a.join("p"));
    let r = p.run(&["--json"]);
    r.ok();
    let err = r.err();
    assert!(err.contains("ferry: skipped A fifo: special file"), "{r}");
    assert!(err.contains("ferry: skipped A p: special file"), "{r}");
    assert!(!err.contains("symlink"), "{r}");
    let skips: Vec<_> = json_lines(&r)
        .into_iter()
        .filter(|j| j.str_field("type") == Some("skip"))
        .collect();
    assert_eq!(skips.len(), 2, "{r}");
    assert!(
        skips.iter().all(|j| j.str_field("side") == Some("A")),
        "{r}"
    );
    assert_eq!(fs::read(p.b.join("p")).unwrap(), b"a file", "{r}");
    assert!(!p.b.join("fifo").exists());
}

// ------------------------------------------------------------------------------------------
// Model-based: random edits on both sides between runs
// ------------------------------------------------------------------------------------------

const NAMES: [&str; 4] = ["a", "b.txt", "c", "d.md"];

/// A random path of depth 1..=3 over a small alphabet (so edits collide often).
fn rand_path(rng: &mut Rng) -> String {
    let depth = rng.range(1, 4);
    (0..depth)
        .map(|_| NAMES[rng.range(0, NAMES.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join("/")
}

/// Existing entries of a replica (relative paths), files or directories.
fn entries(root: &Path, want_dir: Option<bool>) -> Vec<PathBuf> {
    walk(root)
        .into_iter()
        .filter(|p| {
            let md = fs::symlink_metadata(root.join(p)).unwrap();
            want_dir.is_none_or(|d| md.is_dir() == d)
        })
        .collect()
}

/// Content unique to each write.
fn content(rng: &mut Rng, n: u64) -> Vec<u8> {
    let len = rng.range(0, 40) as usize;
    let mut v = format!("content #{n} ").into_bytes();
    v.extend(gen_bytes(len, n));
    v
}

thread_local! {
    /// Paths (in full) that a file of edit 9 left: its bytes changed while its size and
    /// mtime (and, rewritten in place, its inode) stayed. A rename back onto such a path
    /// before the next run makes a change no size+mtime rule can see (only `-c` can):
    /// renames onto them are skipped until the round's run.
    static LEFT_BY_EDIT_9: std::cell::RefCell<std::collections::HashSet<PathBuf>> =
        Default::default();
    /// Paths (in full) that an entry left in this round: deleted, renamed away, replaced
    /// by another type. The other side may still hold there what was there at the last
    /// run; edit 9 keeps a file's size and mtime while changing its bytes, so put there
    /// it may match that file by size and mtime, which a first run takes as the same
    /// content (docs/CLI.md, "First run"): edit 9 lands on none of them.
    static LEFT: std::cell::RefCell<std::collections::HashSet<PathBuf>> = Default::default();
    /// Paths (relative, either side) that a file was moved to in this round, by edit 9
    /// (`true`) or by a rename (`false`). Both sides may move the same file written on both
    /// to one path, one of them by edit 9: two files there of the same size and mtime and
    /// other bytes, which no size+mtime rule can tell apart (a first run takes them as the
    /// same, a later one as both created alike): an edit 9 and a rename never land on one.
    static MOVED_TO: std::cell::RefCell<std::collections::HashMap<PathBuf, bool>> =
        Default::default();
}

/// Whether a move (by edit 9: `by_9`) may land on relative path `q` (see [`MOVED_TO`]).
fn may_land(q: &Path, by_9: bool) -> bool {
    MOVED_TO.with(|m| match m.borrow().get(q) {
        None => true,
        Some(&was_9) => !was_9 && !by_9,
    })
}

/// A file was moved to relative path `q` (see [`MOVED_TO`]).
fn landed(q: &Path, by_9: bool) {
    MOVED_TO.with(|m| *m.borrow_mut().entry(q.to_path_buf()).or_insert(by_9) |= by_9);
}

/// Forget [`LEFT_BY_EDIT_9`], [`LEFT`] and [`MOVED_TO`]: a run has recorded the sides as
/// they are.
fn new_round() {
    LEFT_BY_EDIT_9.with(|s| s.borrow_mut().clear());
    LEFT.with(|s| s.borrow_mut().clear());
    MOVED_TO.with(|s| s.borrow_mut().clear());
}

/// An entry leaves `full` (see [`LEFT`]).
fn leaves(full: &Path) {
    LEFT.with(|s| s.borrow_mut().insert(full.to_path_buf()));
}

/// Whether an entry left `full` or a directory above it in this round (see [`LEFT`]).
fn was_left(full: &Path) -> bool {
    LEFT.with(|s| s.borrow().iter().any(|l| full.starts_with(l)))
}

/// Whether a rename onto `full` would hide a change from size+mtime (see [`LEFT_BY_EDIT_9`]).
fn hides_a_change(full: &Path) -> bool {
    LEFT_BY_EDIT_9.with(|s| s.borrow().contains(full))
}

/// One random edit on `root` (a no-op when it does not apply). `clock` gives each write a
/// distinct mtime so that changes are always visible to size+mtime.
fn edit(root: &Path, op: u8, rng: &mut Rng, clock: &mut u64) {
    *clock += 1;
    let t = 1_600_000_000 + *clock as i64;
    let pick = |rng: &mut Rng, v: Vec<PathBuf>| -> Option<PathBuf> {
        (!v.is_empty()).then(|| v[rng.range(0, v.len() as u64) as usize].clone())
    };
    // Parents that are files block a create: skip such edits.
    let can_create = |p: &Path| {
        let mut q = root.to_path_buf();
        for c in p.parent().into_iter().flat_map(|x| x.components()) {
            q.push(c);
            if let Ok(md) = fs::symlink_metadata(&q) {
                if !md.is_dir() {
                    return false;
                }
            }
        }
        true
    };
    match op % 10 {
        // A new file that rename detection could take for a renamed one: a file deleted
        // and another created elsewhere with the same size and mtime but other bytes (ext4
        // gives it the deleted file's inode), or, what inode reuse amounts to on any file
        // system, the same inode rewritten in place and renamed.
        9 => {
            if let Some(p) = pick(rng, entries(root, Some(false))) {
                let full = root.join(&p);
                let md = fs::symlink_metadata(&full).unwrap();
                let q = PathBuf::from(rand_path(rng));
                if md.is_file()
                    && can_create(&q)
                    && !root.join(&q).exists()
                    && !q.starts_with(&p)
                    && !hides_a_change(&root.join(&q))
                    && !was_left(&root.join(&q))
                    && may_land(&q, true)
                {
                    LEFT_BY_EDIT_9.with(|s| s.borrow_mut().insert(full.clone()));
                    leaves(&full);
                    landed(&q, true);
                    let new: Vec<u8> = fs::read(&full).unwrap().iter().map(|b| b ^ 0x5a).collect();
                    let t = (md.mtime(), md.mtime_nsec() as u32);
                    if rng.chance(1, 2) {
                        fs::remove_file(&full).unwrap();
                        let n = put(root, q.to_str().unwrap(), &new, 0);
                        set_mtime(&n, t);
                    } else {
                        rewrite_keep_meta(&full, &new);
                        if let Some(parent) = root.join(&q).parent() {
                            fs::create_dir_all(parent).unwrap();
                        }
                        fs::rename(&full, root.join(&q)).unwrap();
                    }
                }
            }
        }
        // a symlink (over a file or symlink, or new)
        8 => {
            let p = PathBuf::from(rand_path(rng));
            let full = root.join(&p);
            if can_create(&p) && !full.is_dir() {
                if let Some(parent) = full.parent() {
                    fs::create_dir_all(parent).unwrap();
                }
                let _ = fs::remove_file(&full);
                let target = format!("target-{}", *clock);
                std::os::unix::fs::symlink(&target, &full).unwrap();
            }
        }
        // create or overwrite a file
        0 | 1 => {
            let p = PathBuf::from(rand_path(rng));
            if can_create(&p) && !root.join(&p).is_dir() {
                let c = content(rng, *clock);
                put(root, p.to_str().unwrap(), &c, t);
            }
        }
        // modify an existing file (or what a symlink points to, as an editor would;
        // a symlink to a directory has no file to write)
        2 => {
            if let Some(p) = pick(rng, entries(root, Some(false))) {
                let c = content(rng, *clock);
                if !root.join(&p).is_dir() {
                    put(root, p.to_str().unwrap(), &c, t);
                }
            }
        }
        // delete a file
        3 => {
            if let Some(p) = pick(rng, entries(root, Some(false))) {
                leaves(&root.join(&p));
                fs::remove_file(root.join(p)).unwrap();
            }
        }
        // rename a file (maybe into another directory)
        4 => {
            if let Some(p) = pick(rng, entries(root, Some(false))) {
                let q = PathBuf::from(rand_path(rng));
                if can_create(&q)
                    && !root.join(&q).exists()
                    && !q.starts_with(&p)
                    && !hides_a_change(&root.join(&q))
                    && may_land(&q, false)
                {
                    if let Some(parent) = root.join(&q).parent() {
                        fs::create_dir_all(parent).unwrap();
                    }
                    leaves(&root.join(&p));
                    landed(&q, false);
                    fs::rename(root.join(&p), root.join(&q)).unwrap();
                }
            }
        }
        // mkdir
        5 => {
            let p = PathBuf::from(rand_path(rng));
            if can_create(&p) && fs::symlink_metadata(root.join(&p)).is_err() {
                fs::create_dir_all(root.join(&p)).unwrap();
            }
        }
        // rmdir -r
        6 => {
            if let Some(p) = pick(rng, entries(root, Some(true))) {
                leaves(&root.join(&p));
                fs::remove_dir_all(root.join(p)).unwrap();
            }
        }
        // type change: file -> dir with a file inside, or dir -> file
        _ => {
            if let Some(p) = pick(rng, entries(root, None)) {
                let full = root.join(&p);
                let c = content(rng, *clock);
                leaves(&full);
                if full.is_dir() {
                    fs::remove_dir_all(&full).unwrap();
                    put(root, p.to_str().unwrap(), &c, t);
                } else {
                    fs::remove_file(&full).unwrap();
                    put(root, &format!("{}/inside", p.display()), &c, t);
                }
            }
        }
    }
}

/// One edit of a round: on A, on B, or the same write on both sides (not a conflict);
/// which edit; the seed of its parameters (paths, content).
type Op = (u8, u8, u64);

/// `ferry sync SRC DST`, which must succeed: the S3 tests make changes "on B" in a local
/// mirror of the bucket and sync them up.
/// `--force`: the bucket side may be empty (no objects: a prefix that does not exist).
fn sync(src: impl AsRef<OsStr>, dst: impl AsRef<OsStr>) {
    ferry([
        OsStr::new("sync"),
        OsStr::new("--force"),
        src.as_ref(),
        dst.as_ref(),
    ])
    .ok();
}

/// Apply each round's edits, run, check the rules and that the replicas are equal.
fn model_case(rounds: &[Vec<Op>]) {
    let rounds: Vec<(u8, Vec<Op>)> = rounds.iter().map(|r| (0, r.clone())).collect();
    model_case_with(&rounds);
}

/// Remove a journal file (the journal is "lost").
fn lose_journal(j: &Path) {
    for ext in ["", "-wal", "-shm"] {
        let mut f = j.as_os_str().to_owned();
        f.push(ext);
        let _ = fs::remove_file(PathBuf::from(f));
    }
}

/// What happens between runs besides the edits (`event % 8`): 0-2 nothing; 3 the
/// journal is lost; 4/5 A/B is gone (renamed away: must be refused, even with
/// --force, and never created); 6/7 A/B is empty (an unmounted mount point: refused
/// without --force unless nothing on the other side would be deleted). A replica that
/// went away comes back before the round's run.
fn model_event(p: &Pair, event: u8, synced: &mut bool, base: &mut State, round: usize) {
    let ev = event % 8;
    if ev == 3 {
        lose_journal(&p.j);
        *synced = false;
        return;
    }
    // Only a pair the journal knows has replicas that may not vanish.
    if ev < 4 || !*synced {
        return;
    }
    let root = if ev.is_multiple_of(2) { &p.a } else { &p.b };
    let away = root.with_extension("away");
    // Contents (renaming a root changes its own ctime).
    let before = (state(&p.a), state(&p.b));
    let journal = fs::read(&p.j).unwrap();
    fs::rename(root, &away).unwrap();
    let unchanged = |round: usize| {
        let a = state(if root == &p.a { &away } else { &p.a });
        let b = state(if root == &p.b { &away } else { &p.b });
        assert!(
            a == before.0 && b == before.1,
            "round {round}: a refused run changed something"
        );
    };
    if ev < 6 {
        for extra in [&["--force", "--json"][..], &["-n"], &[]] {
            let r = p.run(extra);
            r.code_is(2);
            let err = r.err();
            assert!(
                err.lines().count() == 1 && err.contains("does not exist"),
                "round {round}: {extra:?}\n{r}"
            );
            assert!(
                !root.exists(),
                "round {round}: a vanished replica was created\n{r}"
            );
            unchanged(round);
        }
        assert_eq!(fs::read(&p.j).unwrap(), journal, "round {round}");
        fs::rename(&away, root).unwrap();
    } else {
        fs::create_dir(root).unwrap();
        let (sa, sb) = (state(&p.a), state(&p.b));
        let r = p.run(&["--json"]);
        if r.code == Some(2) {
            assert!(
                r.err().contains("is empty") && r.err().contains("--force"),
                "round {round}\n{r}"
            );
            assert!(state(root).is_empty(), "round {round}");
            unchanged(round);
            fs::remove_dir(root).unwrap();
            fs::rename(&away, root).unwrap();
        } else {
            // Nothing on the other side was unchanged since the last run: nothing to
            // delete there, so the run goes ahead.
            r.ok();
            assert_eq!(summary_field(&r, "files_deleted"), 0, "round {round}\n{r}");
            let ra = state(&p.a);
            assert!(ra == state(&p.b), "round {round}: replicas differ\n{r}");
            let bad = check_rules(base, &sa, &sb, &ra);
            assert!(bad.is_empty(), "round {round}:\n{}\n{r}", bad.join("\n"));
            *base = ra;
            fs::remove_dir_all(&away).unwrap();
        }
    }
}

/// Like [`model_case`], each round with an event (see [`model_event`]) after its edits.
fn model_case_with(rounds: &[(u8, Vec<Op>)]) {
    let p = pair();
    let mut clock = 0u64;
    let mut base = State::new();
    // A run has completed with the journal: it knows the pair.
    let mut synced = false;
    for (round, (event, ops)) in rounds.iter().enumerate() {
        new_round();
        for &(side, op, seed) in ops {
            let mut rng = Rng::new(seed);
            match side % 3 {
                0 => edit(&p.a, op, &mut rng, &mut clock),
                1 => edit(&p.b, op, &mut rng, &mut clock),
                _ => {
                    clock += 1;
                    let path = rand_path(&mut rng);
                    let c = content(&mut rng, clock);
                    // Every ancestor absent or a real directory (not a file or symlink).
                    let ok = |r: &Path| {
                        !r.join(&path).is_dir()
                            && Path::new(&path).ancestors().skip(1).all(|a| {
                                a.as_os_str().is_empty()
                                    || fs::symlink_metadata(r.join(a)).map_or(true, |m| m.is_dir())
                            })
                    };
                    if ok(&p.a) && ok(&p.b) {
                        put(&p.a, &path, &c, 1_600_000_000 + clock as i64);
                        put(&p.b, &path, &c, 1_600_000_000 + clock as i64);
                    }
                }
            }
        }
        model_event(&p, *event, &mut synced, &mut base, round);
        let (sa, sb) = (state(&p.a), state(&p.b));
        let mut args = vec!["--force", "--json"];
        if !synced {
            // No journal: a first run, or the journal was lost. Both sides non-empty:
            // refused (exit 2, nothing changed) until --resync, which merges them as if
            // nothing had been synced before.
            if !sa.is_empty() && !sb.is_empty() {
                let before = (snapshot(&p.a), snapshot(&p.b));
                let r = p.run(&args);
                r.code_is(2);
                assert!(r.err().contains("--resync"), "round {round}\n{r}");
                assert_untouched(&before.0, &snapshot(&p.a));
                assert_untouched(&before.1, &snapshot(&p.b));
                args.push("--resync");
            }
            base = State::new();
        }
        let r = p.run(&args);
        assert_eq!(r.code, Some(0), "round {round}\n{r}");
        let (ra, rb) = (state(&p.a), state(&p.b));
        assert!(
            ra == rb,
            "round {round}: replicas differ\nA {ra:#?}\nB {rb:#?}\n{r}"
        );
        let bad = check_rules(&base, &sa, &sb, &ra);
        assert!(
            bad.is_empty(),
            "round {round}:\n{}\nbase {base:#?}\nA before {sa:#?}\nB before {sb:#?}\nafter {ra:#?}\n{r}",
            bad.join("\n")
        );
        // A second run right after has nothing to do.
        let r2 = p.run(&["--json"]);
        r2.ok();
        for k in [
            "files_copied",
            "files_deleted",
            "dirs_created",
            "conflicts",
            "renamed",
        ] {
            assert_eq!(summary_field(&r2, k), 0, "round {round}: {k}\n{r2}");
        }
        base = ra;
        synced = true;
    }
}

fn model_config() -> ProptestConfig {
    // Quick by default; FERRY_BISYNC_CASES raises the count for a longer search.
    let cases = std::env::var("FERRY_BISYNC_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48);
    ProptestConfig {
        cases,
        max_shrink_iters: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(model_config())]

    /// Random edits on both replicas between runs (create, modify, delete, rename, mkdir,
    /// rmdir, file <-> directory, symlinks, the same write on both sides, a new file on
    /// a reused inode), 1 to 5 runs, with lost journals, vanished and emptied replicas
    /// between them.
    #[test]
    fn model_random_edits_on_both_sides(
        rounds in prop::collection::vec(
            (0u8..8, prop::collection::vec((0u8..3, 0u8..10, any::<u64>()), 0..10)),
            1..6,
        )
    ) {
        model_case_with(&rounds);
    }
}

// ------------------------------------------------------------------------------------------
// A concurrent writer during the run (issue 28)
// ------------------------------------------------------------------------------------------

/// True when process `pid` holds a file open for writing under `a` or `b`
/// (an unnamed temporary `DIR/#N (deleted)`, or a named one): a copy is under way.
fn copying(pid: u32, a: &Path, b: &Path) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let roots = [
        a.to_string_lossy().into_owned(),
        b.to_string_lossy().into_owned(),
    ];
    fds.flatten().any(|e| {
        fs::read_link(e.path()).is_ok_and(|t| {
            let t = t.to_string_lossy().into_owned();
            roots.iter().any(|r| {
                t.starts_with(r.as_str()) && (t.contains("/#") || t.contains(".ferry-tmp-"))
            })
        })
    })
}

/// One write of the concurrent writer: on A or B (`side`), which (`op`: edit in place,
/// append, replace by a new file, delete, create), which file (`pick`). Every write
/// changes the file's size (a marker of its own length), so a change is never hidden
/// by an equal size and mtime in one tick of the clock. Returns the marker written and
/// the path, if any.
fn concurrent_write(root: &Path, op: u8, pick: u64, n: usize) -> Option<(String, Vec<u8>)> {
    let files: Vec<PathBuf> = entries(root, Some(false))
        .into_iter()
        .filter(|p| !p.to_string_lossy().contains("conflict"))
        .collect();
    let marker = format!("<W{n}:{}>", "w".repeat(n)).into_bytes();
    // Half the time the big file whose paced copy is under way (B's copy is its target).
    let chosen = if pick.is_multiple_of(2) && root.join("big").is_file() {
        Some(PathBuf::from("big"))
    } else {
        (!files.is_empty()).then(|| files[(pick / 2 % files.len() as u64) as usize].clone())
    };
    match (op % 5, chosen) {
        (0, Some(p)) => {
            let mut d = fs::read(root.join(&p)).ok()?;
            d.extend_from_slice(&marker);
            d.rotate_right(marker.len());
            fs::write(root.join(&p), &d).ok()?;
            Some((p.to_string_lossy().into_owned(), marker))
        }
        (1, Some(p)) => {
            use std::io::Write;
            let mut f = fs::OpenOptions::new()
                .append(true)
                .open(root.join(&p))
                .ok()?;
            f.write_all(&marker).ok()?;
            Some((p.to_string_lossy().into_owned(), marker))
        }
        (2, Some(p)) => {
            let tmp = root.join(format!("writer-tmp-{n}"));
            fs::write(&tmp, &marker).ok()?;
            fs::rename(&tmp, root.join(&p)).ok()?;
            Some((p.to_string_lossy().into_owned(), marker))
        }
        (3, Some(p)) => {
            let _ = fs::remove_file(root.join(&p));
            Some((p.to_string_lossy().into_owned(), Vec::new()))
        }
        _ => {
            let p = format!("new{}", pick % 4);
            let full = root.join(&p);
            if full.exists() {
                return None;
            }
            fs::write(&full, &marker).ok()?;
            Some((p, marker))
        }
    }
}

/// Files of both replicas (conflict copies included) holding `marker`.
fn marker_kept(a: &Path, b: &Path, marker: &[u8]) -> bool {
    [a, b].iter().any(|root| {
        entries(root, Some(false)).iter().any(|p| {
            fs::read(root.join(p)).is_ok_and(|d| d.windows(marker.len()).any(|w| w == marker))
        })
    })
}

/// Random edits between runs, then a run during which a writer edits, appends to,
/// replaces, deletes and creates files on both sides (once the run's copy of a big file,
/// paced by `--bwlimit`, is under way). The invariant: every byte the writer wrote is
/// in a replica (a conflict copy counts) or its path is named on stderr with exit 1;
/// the next run converges (exit 0, replicas equal, every byte in them), and the one
/// after has nothing to do.
fn concurrent_case(edits: &[(u8, u8, u64)], writes: &[(bool, u8, u64)]) {
    let p = pair();
    let mut clock = 0u64;
    for i in 0..6u64 {
        put(
            &p.a,
            &format!("f{i}"),
            &gen_bytes(20 + i as usize, i),
            1_600_000_000,
        );
        put(
            &p.a,
            &format!("d/g{i}"),
            &gen_bytes(30 + i as usize, i),
            1_600_000_000,
        );
    }
    put(&p.a, "big", &gen_bytes(1 << 20, 7), 1_600_000_000);
    p.run(&[]).ok();
    for &(side, op, seed) in edits {
        let mut rng = Rng::new(seed);
        let root = if side % 2 == 0 { &p.a } else { &p.b };
        // Edits 0-6 only (no symlinks, no type changes): files the writer can touch.
        edit(root, op % 7, &mut rng, &mut clock);
        new_round();
    }
    // The big file changes on one side: its copy, paced, is the writer's window.
    put(&p.a, "big", &gen_bytes(1 << 20, 8), 1_600_000_100);
    let mut args: Vec<OsString> = vec!["bisync".into(), "--journal".into(), p.j.clone().into()];
    for a in ["--force", "--bwlimit", "2M"] {
        args.push(a.into());
    }
    args.push(p.a.clone().into());
    args.push(p.b.clone().into());
    let child = Command::new(bin())
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (a, b) = (p.a.clone(), p.b.clone());
    let (out, written) = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let start = std::time::Instant::now();
            while !copying(pid, &a, &b) {
                if start.elapsed() > Duration::from_secs(60)
                    || !Path::new(&format!("/proc/{pid}")).exists()
                {
                    break;
                }
                sleep(Duration::from_millis(2));
            }
            let mut written = Vec::new();
            for (n, &(on_a, op, pick)) in writes.iter().enumerate() {
                let root = if on_a { &a } else { &b };
                match concurrent_write(root, op, pick, n + 1) {
                    Some((path, marker)) => written.push((on_a, path, Some(marker))),
                    None => written.push((on_a, String::new(), None)),
                }
            }
            written
        });
        let out = child.wait_with_output().unwrap();
        (out, w.join().unwrap())
    });
    let r = Run {
        args,
        code: out.status.code(),
        stdout: out.stdout,
        stderr: out.stderr,
    };
    assert!(matches!(r.code, Some(0) | Some(1)), "{r}");
    // A later write to the same file on the same side replaced an earlier one (a
    // delete: an empty marker): only the last write of each path and side is owed.
    let mut last: BTreeMap<(bool, String), Vec<u8>> = BTreeMap::new();
    for (on_a, path, marker) in &written {
        if let Some(m) = marker {
            last.insert((*on_a, path.clone()), m.clone());
        }
    }
    last.retain(|_, m| !m.is_empty());
    for ((_, path), marker) in &last {
        if marker_kept(&p.a, &p.b, marker) {
            continue;
        }
        assert!(
            r.code == Some(1) && r.err().contains(path.as_str()),
            "{path}: the writer's bytes {:?} are lost and not reported\n{r}",
            String::from_utf8_lossy(marker)
        );
    }
    // The next run converges, keeping every byte still on disk.
    let r2 = p.run(&["--force", "--json"]);
    r2.ok();
    let (ra, rb) = (state(&p.a), state(&p.b));
    assert!(
        ra == rb,
        "replicas differ after the next run\nA {ra:#?}\nB {rb:#?}\n{r}\n{r2}"
    );
    for ((_, path), marker) in &last {
        assert!(
            marker_kept(&p.a, &p.b, marker),
            "{path}: lost by the next run\n{r}\n{r2}"
        );
    }
    let r3 = p.run(&["--json"]);
    r3.ok();
    for k in [
        "files_copied",
        "files_deleted",
        "dirs_created",
        "conflicts",
        "renamed",
    ] {
        assert_eq!(summary_field(&r3, k), 0, "{k}\n{r3}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..model_config() })]

    /// A concurrent writer on both sides during a run (see [`concurrent_case`]).
    #[test]
    fn model_concurrent_writer_loses_nothing(
        edits in prop::collection::vec((0u8..2, 0u8..7, any::<u64>()), 0..8),
        writes in prop::collection::vec((any::<bool>(), 0u8..5, any::<u64>()), 1..8),
    ) {
        concurrent_case(&edits, &writes);
    }
}

// ------------------------------------------------------------------------------------------
// kill -9 at random moments
// ------------------------------------------------------------------------------------------

#[test]
fn kill_at_random_moments_loses_nothing() {
    for seed in 0..6u64 {
        let p = pair();
        let mut rng = Rng::new(1000 + seed);
        // A synced base, then many changes on both sides.
        for i in 0..300 {
            put(
                &p.a,
                &format!("d{}/f{i}", i % 10),
                &gen_bytes(2000, i),
                1_600_000_000,
            );
        }
        p.run(&[]).ok();
        let base = state(&p.a);
        for i in 0..300u64 {
            let f = format!("d{}/f{i}", i % 10);
            match rng.range(0, 6) {
                0 => {
                    put(&p.a, &f, &gen_bytes(3000, 10_000 + i), 1_600_000_100);
                }
                1 => {
                    put(&p.b, &f, &gen_bytes(3001, 20_000 + i), 1_600_000_200);
                }
                2 => {
                    put(&p.a, &f, &gen_bytes(3002, 30_000 + i), 1_600_000_100);
                    put(&p.b, &f, &gen_bytes(3003, 40_000 + i), 1_600_000_200);
                }
                3 => fs::remove_file(p.a.join(&f)).unwrap(),
                4 => {
                    fs::create_dir_all(p.b.join("moved")).unwrap();
                    fs::rename(p.b.join(&f), p.b.join(format!("moved/f{i}"))).unwrap();
                }
                _ => {}
            }
        }
        for i in 0..200u64 {
            put(
                &p.b,
                &format!("newb/n{i}"),
                &gen_bytes(5000, 50_000 + i),
                1_600_000_300,
            );
        }
        let (sa, sb) = (state(&p.a), state(&p.b));
        // Kill runs at random moments, then let one finish.
        for _ in 0..4 {
            let mut c = spawn_ferry([
                OsString::from("bisync"),
                "--force".into(),
                "--journal".into(),
                p.j.clone().into(),
                p.a.clone().into(),
                p.b.clone().into(),
            ]);
            sleep(Duration::from_micros(rng.range(0, 60_000)));
            let _ = c.kill();
            let _ = c.wait();
        }
        let r = p.run(&["--force"]);
        r.ok();
        let r2 = p.run(&["--json"]);
        r2.ok();
        assert_eq!(summary_field(&r2, "files_copied"), 0, "{r2}");
        let (ra, rb) = (state(&p.a), state(&p.b));
        assert!(ra == rb, "seed {seed}: replicas differ after kills");
        let bad = check_rules(&base, &sa, &sb, &ra);
        assert!(bad.is_empty(), "seed {seed}:\n{}", bad.join("\n"));
        assert!(
            !ra.keys().any(|k| k.contains(".ferry-tmp-")),
            "seed {seed}: temporaries left"
        );
    }
}

// ------------------------------------------------------------------------------------------
// A local, B an S3 prefix (Garage: FERRY_TEST_S3_*; FERRY_SKIP_S3=1 skips on purpose)
// ------------------------------------------------------------------------------------------

struct S3 {
    bucket: String,
}

fn s3() -> Option<S3> {
    if std::env::var_os("FERRY_SKIP_S3").is_some() {
        return None;
    }
    let get = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run the tests with scripts/test (it starts Garage), or set FERRY_SKIP_S3=1"))
    };
    let endpoint = get("FERRY_TEST_S3_ENDPOINT");
    std::env::set_var("AWS_ACCESS_KEY_ID", get("FERRY_TEST_S3_KEY"));
    std::env::set_var("AWS_SECRET_ACCESS_KEY", get("FERRY_TEST_S3_SECRET"));
    std::env::set_var("AWS_REGION", get("FERRY_TEST_S3_REGION"));
    std::env::set_var("AWS_ENDPOINT_URL", &endpoint);
    Some(S3 {
        bucket: get("FERRY_TEST_S3_BUCKET"),
    })
}

impl S3 {
    fn url(&self, test: &str) -> String {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("s3://{}/bisync-{test}-{n}", self.bucket)
    }
}

/// Only the files of a state (an object store has no empty directories).
fn files(s: &State) -> State {
    s.iter()
        .filter(|(_, n)| matches!(n, Node::File { .. }))
        .map(|(k, n)| (k.clone(), n.clone()))
        .collect()
}

/// Download the prefix into a fresh directory and return its files.
fn s3_state(url: &str, work: &Path) -> State {
    let down = work.join(format!(
        "down-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    sync(url, &down);
    files(&state(&down))
}

fn s3_bisync(a: &Path, url: &str, j: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<OsString> = vec!["bisync".into(), "--journal".into(), j.into()];
    args.extend(extra.iter().map(OsString::from));
    args.push(a.into());
    args.push(url.into());
    ferry(&args)
}

#[test]
fn s3_two_way_rules() {
    let Some(s3) = s3() else { return };
    let p = pair();
    let url = s3.url("rules");
    let work = p.a.parent().unwrap().to_path_buf();
    put(&p.a, "doc/report.txt", b"v1", 1_600_000_000);
    put(&p.a, "doc/gone.txt", b"to delete", 1_600_000_000);
    put(&p.a, "photo.raw", &gen_bytes(300_000, 3), 1_600_000_000);
    put(&p.a, "keep", b"k", 1_600_000_000);
    chmod(&p.a.join("keep"), 0o600);
    s3_bisync(&p.a, &url, &p.j, &[]).ok();
    assert_eq!(s3_state(&url, &work), files(&state(&p.a)));

    // Changes on both sides: B's through a mirror synced up.
    let mirror = work.join("mirror");
    sync(&url, &mirror);
    put(&mirror, "from_s3.txt", b"made on B", 1_600_000_100);
    put(&mirror, "doc/report.txt", b"v2 from B", 1_600_000_200);
    fs::remove_file(mirror.join("doc/gone.txt")).unwrap();
    sync(&mirror, &url);
    put(&p.a, "doc/report.txt", b"v2 from A!", 1_600_000_300);
    fs::rename(p.a.join("photo.raw"), p.a.join("doc/photo.raw")).unwrap();
    let r = s3_bisync(&p.a, &url, &p.j, &["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "conflicts"), 1, "{r}");
    assert_eq!(summary_field(&r, "renamed"), 1, "{r}");
    let sa = files(&state(&p.a));
    assert_eq!(s3_state(&url, &work), sa);
    assert_eq!(data(&sa, "from_s3.txt").unwrap(), b"made on B");
    assert!(!sa.contains_key("doc/gone.txt"));
    assert_eq!(data(&sa, "doc/report.txt").unwrap(), b"v2 from A!");
    let c = conflict_copies(&sa, "doc/report.txt");
    assert_eq!(c.len(), 1, "{sa:?}");
    assert_eq!(data(&sa, &c[0]).unwrap(), b"v2 from B");
    assert_eq!(data(&sa, "doc/photo.raw").unwrap(), gen_bytes(300_000, 3));

    // A rename made on the S3 side (no inodes there) is replayed as a rename on A.
    let mirror2 = work.join("mirror2");
    sync(&url, &mirror2);
    let ino = fs::metadata(p.a.join("doc/photo.raw")).unwrap().ino();
    fs::rename(
        mirror2.join("doc/photo.raw"),
        mirror2.join("photo-moved.raw"),
    )
    .unwrap();
    sync(&mirror2, &url);
    let r = s3_bisync(&p.a, &url, &p.j, &["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "renamed"), 1, "{r}");
    assert_eq!(
        fs::metadata(p.a.join("photo-moved.raw")).unwrap().ino(),
        ino
    );
    assert_eq!(s3_state(&url, &work), files(&state(&p.a)));

    // No-op.
    let r = s3_bisync(&p.a, &url, &p.j, &["--json"]);
    r.ok();
    assert_eq!(summary_field(&r, "files_copied"), 0, "{r}");
    assert_eq!(summary_field(&r, "files_deleted"), 0, "{r}");
}

#[test]
fn s3_model_random_edits_on_both_sides() {
    let Some(s3) = s3() else { return };
    for seed in 0..6u64 {
        let p = pair();
        let url = s3.url(&format!("model{seed}"));
        let work = p.a.parent().unwrap().to_path_buf();
        let mut rng = Rng::new(77 + seed);
        let mut clock = 0u64;
        let mut base = State::new();
        for round in 0..3 {
            new_round();
            for _ in 0..rng.range(0, 6) {
                let op = rng.range(0, 8) as u8;
                edit(&p.a, op, &mut rng, &mut clock);
            }
            let mirror = work.join(format!("mirror{round}"));
            sync(&url, &mirror);
            for _ in 0..rng.range(0, 6) {
                let op = rng.range(0, 8) as u8;
                edit(&mirror, op, &mut rng, &mut clock);
            }
            sync(&mirror, &url);
            let (sa, sb) = (files(&state(&p.a)), s3_state(&url, &work));
            // The first run of the pair: both sides may hold files.
            let first = ["--force", "--json", "--resync"];
            let r = s3_bisync(
                &p.a,
                &url,
                &p.j,
                if round == 0 { &first } else { &first[..2] },
            );
            assert_eq!(r.code, Some(0), "seed {seed} round {round}\n{r}");
            let (ra, rb) = (files(&state(&p.a)), s3_state(&url, &work));
            assert!(
                ra == rb,
                "seed {seed} round {round}: replicas differ\nA {ra:#?}\nB {rb:#?}\n{r}"
            );
            let bad = check_rules(&base, &sa, &sb, &ra);
            assert!(
                bad.is_empty(),
                "seed {seed} round {round}:\n{}\n{r}",
                bad.join("\n")
            );
            base = ra;
        }
    }
}

/// Delete one object behind ferry's back (curl signs the request).
fn s3_delete(bucket: &str, key: &str) {
    let env = |k: &str| std::env::var(k).unwrap();
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "DELETE",
        ])
        .arg("--aws-sigv4")
        .arg(format!("aws:amz:{}:s3", env("FERRY_TEST_S3_REGION")))
        .arg("--user")
        .arg(format!(
            "{}:{}",
            env("FERRY_TEST_S3_KEY"),
            env("FERRY_TEST_S3_SECRET")
        ))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        .arg(format!("{}/{bucket}/{key}", env("FERRY_TEST_S3_ENDPOINT")))
        .output()
        .expect("run curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "204", "DELETE {key}");
}

/// An S3 prefix with no objects is an empty root (S3 cannot tell it from a missing
/// one): with a journal that knew files, refused unless --force, as a local root is.
#[test]
fn s3_emptied_prefix_is_refused_unless_force() {
    let Some(s3) = s3() else { return };
    let p = pair();
    let url = s3.url("emptied");
    for i in 0..3 {
        put(&p.a, &format!("d/f{i}"), b"data", 1_600_000_000);
    }
    s3_bisync(&p.a, &url, &p.j, &[]).ok();
    let prefix = url.strip_prefix(&format!("s3://{}/", s3.bucket)).unwrap();
    for i in 0..3 {
        s3_delete(&s3.bucket, &format!("{prefix}/d/f{i}"));
    }
    let before = snapshot(&p.a);
    for extra in [&[][..], &["-n"], &["--max-delete", "100"]] {
        let r = s3_bisync(&p.a, &url, &p.j, extra);
        r.code_is(2);
        let want = format!("ferry: B {url} is empty, but held 3 files");
        assert!(r.err().starts_with(&want), "{r}");
        assert!(r.err().contains("--force to delete 3 files"), "{r}");
        assert_untouched(&before, &snapshot(&p.a));
    }
    s3_bisync(&p.a, &url, &p.j, &["--force"]).ok();
    assert!(files(&state(&p.a)).is_empty());
}

/// HEAD requests the S3 side (B) made, from `-v`.
fn heads_of_b(r: &Run) -> u64 {
    let err = r.err();
    let line = err
        .lines()
        .find(|l| l.starts_with("ferry: s3 B:"))
        .unwrap_or_else(|| panic!("no s3 line\n{r}"));
    line["ferry: s3 B: ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("bad s3 line {line}"))
}

/// The journal vouches for objects whose listed version (ETag and
/// LastModified) is the one it recorded: a no-op run against S3 makes no
/// HEAD request, and a run after changes HEADs only what changed on that
/// side (plus the checks before writing over or deleting). A change made
/// behind ferry's back, even to metadata only, is still seen.
#[test]
fn s3_noop_makes_no_head_requests() {
    let Some(s3) = s3() else { return };
    let p = pair();
    let url = s3.url("noheads");
    let work = p.a.parent().unwrap().to_path_buf();
    for i in 0..30 {
        put(
            &p.a,
            &format!("d{}/f{i}", i % 3),
            format!("file {i}").as_bytes(),
            1_600_000_000 + i,
        );
    }
    // The first run uploads all: one HEAD per object (the check that
    // nothing appeared there meanwhile), none after the upload.
    let r = s3_bisync(&p.a, &url, &p.j, &["-v"]);
    r.ok();
    assert!(heads_of_b(&r) <= 30, "{r}");
    // An upload's listed version is only known from the next listing: the
    // first run after it asks once per uploaded object, and records it.
    let r = s3_bisync(&p.a, &url, &p.j, &["-v"]);
    r.ok();
    assert!(heads_of_b(&r) <= 30, "{r}");
    let r = s3_bisync(&p.a, &url, &p.j, &["-v"]);
    r.ok();
    assert_eq!(heads_of_b(&r), 0, "{r}");
    assert_eq!(s3_state(&url, &work), files(&state(&p.a)));

    // Two objects changed on the S3 side: one re-uploaded with new bytes,
    // one with only a new mtime (same bytes, same size).
    let mirror = work.join("mirror");
    sync(&url, &mirror);
    put(&mirror, "d0/f0", b"FILE 0", 1_600_000_500);
    set_mtime(&mirror.join("d1/f1"), (1_600_000_600, 0));
    sync(&mirror, &url);
    let r = s3_bisync(&p.a, &url, &p.j, &["-v", "--json"]);
    r.ok();
    assert!(heads_of_b(&r) <= 4, "{r}");
    assert_eq!(summary_field(&r, "files_copied"), 2, "{r}");
    assert_eq!(fs::read(p.a.join("d0/f0")).unwrap(), b"FILE 0");
    assert_eq!(
        fs::metadata(p.a.join("d1/f1")).unwrap().mtime(),
        1_600_000_600
    );
    let r = s3_bisync(&p.a, &url, &p.j, &["-v"]);
    r.ok();
    assert_eq!(heads_of_b(&r), 0, "{r}");
}

/// A case the model test found (CI, 2026-11-23): on A a dangling symlink `a`, then a
/// write of `a` on both sides (on A it lands in the symlink's target), then that target
/// turned into a directory, then `a` modified on A. The test's own edit wrote through the
/// symlink into the directory; bisync was right all along (a conflict copy of B's `a`).
#[test]
fn model_regression_type_change_under_a_shared_write() {
    model_case(&[
        vec![
            (0, 8, 12901465298048091),
            (2, 0, 2663223427401937073),
            (0, 7, 5059185928480526341),
        ],
        vec![(0, 2, 5638573662210935323)],
    ]);
}

/// A case the model test found (CI, 2026-11-27): a file written on both sides, on A
/// renamed away, then edit 9 put its bytes changed, size and mtime kept, back at the
/// path it left. B still holds the original there: same size, same mtime, other bytes,
/// which a first run takes as the same content (docs/CLI.md, "First run"; only `-c`
/// can tell). The test's edit 9 no longer lands on a path a file left in the round.
#[test]
fn model_regression_edit_9_back_where_a_file_left() {
    model_case(&[vec![
        (2, 0, 7037356198646107516),
        (0, 4, 188782167451045026),
        (0, 9, 15157019668096478816),
    ]]);
}

/// A case the model test found (CI, 2026-11-28): a file written on both sides, on B
/// renamed, on A moved by edit 9 (bytes changed, size and mtime kept) to the very path B
/// renamed it to. Both sides then hold a file there of the same size and mtime and other
/// bytes, which a first run takes as the same content (docs/CLI.md, "First run"; only `-c`
/// can tell), as does a later run that sees both created. The test's edit 9 and renames no
/// longer land on a path the other kind landed on in the round.
#[test]
fn model_regression_edit_9_onto_the_other_sides_rename() {
    model_case(&[vec![
        (2, 0, 1733869131146658089),
        (1, 4, 4230620492722475299),
        (0, 9, 3665574626078125136),
    ]]);
}
