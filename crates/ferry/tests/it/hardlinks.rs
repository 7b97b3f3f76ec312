//! Hard links (`-H`): random trees whose files have several names, within and across
//! directories, then random edits of SRC across runs (a link added, a link broken with size
//! and mtime kept, a name deleted, the first name of a group deleted, a file rewritten in
//! place or replaced, a new name linked). After each `sync -H`, DST's names are grouped by
//! inode exactly as SRC's, bytes and metadata are equal, and a rerun changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{lchown, MetadataExt};
use std::path::{Path, PathBuf};

use crate::util::s3::*;
use crate::util::ssh::*;
use crate::util::*;
use proptest::prelude::*;

/// An index into a list whose length is known only later, as proptest's `sample::Index`
/// (the same mapping), but one a regression case can write down.
#[derive(Clone, Copy, Debug)]
struct Index(u64);

impl Index {
    fn index(&self, len: usize) -> usize {
        ((len as u128 * self.0 as u128) >> 64) as usize
    }
}

impl Arbitrary for Index {
    type Parameters = ();
    type Strategy = prop::strategy::Map<prop::num::u64::Any, fn(u64) -> Index>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        any::<u64>().prop_map(Index as fn(u64) -> Index)
    }
}

/// Directories of the generated trees (the root first).
const DIRS: &[&str] = &["", "a", "b", "a/c"];

#[derive(Clone, Debug)]
struct File {
    size: usize,
    seed: u64,
    mtime: Mtime,
    mode: u32,
}

/// Files (inodes) and their names: name `i` is `DIRS[dir]/f{i}`, a name of `files[file]`.
#[derive(Clone, Debug)]
struct Tree {
    files: Vec<File>,
    names: Vec<(Index, Index)>,
}

fn file() -> impl Strategy<Value = File> {
    (
        prop_oneof![Just(0usize), 1usize..200, Just(70_000usize)],
        any::<u64>(),
        (1_000_000_000i64..1_900_000_000, 0u32..1_000_000_000),
        prop::sample::select(&[0o644u32, 0o600, 0o755, 0o444][..]),
    )
        .prop_map(|(size, seed, mtime, mode)| File {
            size,
            seed,
            mtime,
            mode,
        })
}

fn tree() -> impl Strategy<Value = Tree> {
    (
        prop::collection::vec(file(), 1..6),
        prop::collection::vec((any::<Index>(), any::<Index>()), 1..14),
    )
        .prop_map(|(files, names)| Tree { files, names })
}

fn materialize_tree(root: &Path, t: &Tree) {
    for d in DIRS {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    let mut first: BTreeMap<usize, PathBuf> = BTreeMap::new();
    for (i, (dir, f)) in t.names.iter().enumerate() {
        let p = root.join(DIRS[dir.index(DIRS.len())]).join(format!("f{i}"));
        let k = f.index(t.files.len());
        match first.get(&k) {
            Some(q) => fs::hard_link(q, &p).unwrap(),
            None => {
                let spec = &t.files[k];
                fs::write(&p, gen_bytes(spec.size, spec.seed)).unwrap();
                chmod(&p, spec.mode);
                first.insert(k, p);
            }
        }
    }
    for (k, p) in &first {
        set_mtime(p, t.files[*k].mtime);
    }
}

#[derive(Clone, Debug)]
enum Edit {
    /// The second name becomes a name of the first's file.
    LinkAdd(Index, Index),
    /// The name gets a file of its own: same bytes, mode and mtime.
    LinkBreak(Index),
    Delete(Index),
    /// The first name (by path) of the file with this name.
    DeleteFirst(Index),
    /// New bytes and mtime in the same file (every name sees them).
    Rewrite(Index, u64),
    /// A new file at the name.
    Replace(Index, u64),
    /// A new name, in `DIRS[dir]`, of the file.
    NewName(Index, Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::LinkAdd(a, b)),
        3 => any::<Index>().prop_map(Edit::LinkBreak),
        2 => any::<Index>().prop_map(Edit::Delete),
        2 => any::<Index>().prop_map(Edit::DeleteFirst),
        2 => (any::<Index>(), any::<u64>()).prop_map(|(i, s)| Edit::Rewrite(i, s)),
        1 => (any::<Index>(), any::<u64>()).prop_map(|(i, s)| Edit::Replace(i, s)),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(i, d)| Edit::NewName(i, d)),
    ]
}

/// Regular files under `root` (relative paths, sorted).
fn files(root: &Path) -> Vec<PathBuf> {
    walk(root)
        .into_iter()
        .filter(|r| fs::symlink_metadata(root.join(r)).unwrap().is_file())
        .collect()
}

fn apply_edits(root: &Path, edits: &[Edit]) {
    for (n, e) in edits.iter().enumerate() {
        let names = files(root);
        if names.is_empty() {
            return;
        }
        let pick = |i: &Index| root.join(&names[i.index(names.len())]);
        match e {
            Edit::LinkAdd(a, b) => {
                let (a, b) = (pick(a), pick(b));
                if a != b {
                    fs::remove_file(&b).unwrap();
                    fs::hard_link(&a, &b).unwrap();
                }
            }
            Edit::LinkBreak(i) => {
                let p = pick(i);
                let md = fs::metadata(&p).unwrap();
                let data = fs::read(&p).unwrap();
                fs::remove_file(&p).unwrap();
                fs::write(&p, data).unwrap();
                chmod(&p, md.mode() & 0o7777);
                set_mtime(&p, (md.mtime(), md.mtime_nsec() as u32));
            }
            Edit::Delete(i) => fs::remove_file(pick(i)).unwrap(),
            Edit::DeleteFirst(i) => {
                let ino = fs::metadata(pick(i)).unwrap().ino();
                let first = names
                    .iter()
                    .find(|r| fs::metadata(root.join(r)).unwrap().ino() == ino)
                    .unwrap();
                fs::remove_file(root.join(first)).unwrap();
            }
            Edit::Rewrite(i, seed) => {
                let p = pick(i);
                let old = get_mtime(&p);
                let mode = fs::metadata(&p).unwrap().mode();
                chmod(&p, 0o644);
                fs::write(&p, gen_bytes((*seed % 300) as usize, *seed)).unwrap();
                chmod(&p, mode & 0o7777);
                set_mtime(&p, differ((old.0 + 7, old.1), old));
            }
            Edit::Replace(i, seed) => {
                let p = pick(i);
                fs::remove_file(&p).unwrap();
                fs::write(&p, gen_bytes((*seed % 300) as usize, *seed)).unwrap();
            }
            Edit::NewName(i, d) => {
                let p = pick(i);
                let q = root.join(DIRS[d.index(DIRS.len())]).join(format!("n{n}"));
                if !q.exists() {
                    fs::hard_link(&p, &q).unwrap();
                }
            }
        }
    }
}

/// The names of `root`'s files grouped by inode: one set of paths per file.
fn link_groups(root: &Path) -> BTreeSet<BTreeSet<PathBuf>> {
    let mut by_ino: BTreeMap<(u64, u64), BTreeSet<PathBuf>> = BTreeMap::new();
    for r in files(root) {
        let md = fs::symlink_metadata(root.join(&r)).unwrap();
        by_ino.entry((md.dev(), md.ino())).or_default().insert(r);
    }
    by_ino.into_values().collect()
}

#[track_caller]
fn assert_same_links(src: &Path, dst: &Path, r: &Run) {
    let (a, b) = (link_groups(src), link_groups(dst));
    assert_eq!(a, b, "inode groups differ (SRC left, DST right)\n{r}");
}

/// `sync -H` once more: no write of any kind (inodes and ctimes as they were).
#[track_caller]
fn assert_rerun_does_nothing(src: &Path, dst: &Path, flags: &[&str]) {
    let before = snapshot(dst);
    let mut f = flags.to_vec();
    f.extend(["-H", "--json"]);
    let r = run_on("sync", src, dst, &f);
    r.ok();
    let s = summary(&r);
    assert_eq!(
        (
            s.files_copied,
            s.hard_links,
            s.files_deleted,
            s.dirs_created,
            s.errors
        ),
        (0, 0, 0, 0, 0),
        "rerun did work\n{r}"
    );
    assert_untouched(&before, &snapshot(dst));
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 32,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// copy -H and sync -H link DST as SRC is linked; a DST first made without -H (every
    /// name a file of its own) gets linked by sync -H; after random edits of SRC, sync -H
    /// makes DST's inode groups SRC's again (links added, broken, leaders deleted); reruns
    /// change nothing.
    #[test]
    fn sync_h_keeps_inode_groups_across_runs(
        spec in tree(),
        edits in prop::collection::vec(edit(), 1..8),
        j in prop::sample::select(&["1", "2", "8"][..]),
        checksum in any::<bool>(),
    ) {
        sync_h_keeps_groups(&spec, &edits, j, checksum)?;
    }
}

/// The body of `sync_h_keeps_inode_groups_across_runs`, for its regression cases too.
fn sync_h_keeps_groups(
    spec: &Tree,
    edits: &[Edit],
    j: &str,
    checksum: bool,
) -> Result<(), TestCaseError> {
    let t = tmpdir();
    let (src, dst, copy) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("copy"),
    );
    materialize_tree(&src, spec);
    let flags = ["-j", j];

    let r = run_on("copy", &src, &copy, &["-H", "-j", j]);
    r.ok();
    assert_trees_equal(&src, &copy);
    assert_same_links(&src, &copy, &r);

    // Without -H: every name a file of its own.
    let r = run_on("sync", &src, &dst, &flags);
    r.ok();
    assert_trees_equal(&src, &dst);
    prop_assert!(
        link_groups(&dst).iter().all(|g| g.len() == 1),
        "linked without -H\n{}",
        r
    );

    let r = run_on("sync", &src, &dst, &["-H", "--json", "-j", j]);
    r.ok();
    assert_trees_equal(&src, &dst);
    assert_same_links(&src, &dst, &r);
    let linked: usize = link_groups(&src).iter().map(|g| g.len() - 1).sum();
    prop_assert_eq!(summary(&r).hard_links as usize, linked, "{}", r);
    prop_assert_eq!(summary(&r).files_copied, 0, "{}", r);
    assert_rerun_does_nothing(&src, &dst, &flags);

    apply_edits(&src, edits);
    let mut f = vec!["-H", "--json", "-j", j];
    if checksum {
        f.push("-c");
    }
    let r = run_on("sync", &src, &dst, &f);
    r.ok();
    prop_assert_eq!(summary(&r).errors, 0);
    assert_trees_equal(&src, &dst);
    assert_same_links(&src, &dst, &r);
    assert_rerun_does_nothing(&src, &dst, &flags);
    Ok(())
}

/// A case `sync_h_keeps_inode_groups_across_runs` found (its minimal input, kept as it
/// was generated): two empty files, thirteen names, links added and broken, first names
/// deleted, then `sync -H -c -j 1`.
#[test]
fn sync_h_regression_empty_files_regrouped_with_checksum() {
    let spec = Tree {
        files: vec![
            File {
                size: 0,
                seed: 0,
                mtime: (1_000_000_000, 0),
                mode: 0o644,
            },
            File {
                size: 0,
                seed: 0,
                mtime: (1_012_531_437, 203_938_551),
                mode: 0o755,
            },
        ],
        names: vec![
            (Index(14492012466156858500), Index(6769965676114069546)),
            (Index(3081183517878091170), Index(12681584174171890184)),
            (Index(14894065574077684211), Index(14962740487877992945)),
            (Index(9323639331983581069), Index(13789052736257659469)),
            (Index(2560988818318684360), Index(12760567335662180983)),
            (Index(2205978850640284859), Index(4348411263061463548)),
            (Index(674272094101009212), Index(8414825374358831560)),
            (Index(14110056911817526212), Index(13014834073531099755)),
            (Index(2704614099975130124), Index(15626595178310780599)),
            (Index(11723738781570934812), Index(6064561946240544308)),
            (Index(14098531128138421290), Index(13413951766452616586)),
            (Index(17490245620629927924), Index(6320623425642781127)),
            (Index(747409828190698618), Index(14192277294454074903)),
        ],
    };
    let edits = [
        Edit::LinkAdd(Index(1942246156142346154), Index(12858318758684631500)),
        Edit::DeleteFirst(Index(7552422823196017539)),
        Edit::LinkAdd(Index(3170624608028257953), Index(15690528563298343456)),
        Edit::LinkAdd(Index(2036740345105793115), Index(4999037238207350614)),
        Edit::DeleteFirst(Index(11859317405596437379)),
        Edit::LinkAdd(Index(13999288863214037398), Index(9963799789533482130)),
        Edit::LinkBreak(Index(1432441752190100612)),
    ];
    sync_h_keeps_groups(&spec, &edits, "1", true).unwrap();
}

fn ssh_config() -> ProptestConfig {
    ProptestConfig {
        cases: 8,
        ..config()
    }
}

proptest! {
    #![proptest_config(ssh_config())]

    /// The same over ssh (`ferry serve` on the other end makes the links): a linked tree
    /// pushed with `sync -H`, random edits pushed again, then pulled back into a fresh
    /// directory and into the first copy; every time the inode groups are SRC's.
    #[test]
    fn sync_h_over_ssh_push_and_pull(
        spec in tree(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let Ok((rsh, host)) = ssh_server() else {
            crate::util::skip(&"FERRY_TEST_SSH_* not set (scripts/test starts sshd)");
            return Ok(());
        };
        let t = tmpdir();
        let (src, far, back) = (t.path().join("src"), t.path().join("far"), t.path().join("back"));
        materialize_tree(&src, &spec);
        let push = |f: &[&str]| {
            let mut a: Vec<OsString> = f.iter().map(OsString::from).collect();
            a.extend([src.clone().into(), ssh_at(&host, &far)]);
            ferry_ssh(&rsh, "sync", &a)
        };
        let r = push(&["-H", "--json"]);
        r.ok();
        assert_trees_equal(&src, &far);
        assert_same_links(&src, &far, &r);
        let linked: usize = link_groups(&src).iter().map(|g| g.len() - 1).sum();
        prop_assert_eq!(summary(&r).hard_links as usize, linked, "{}", r);

        apply_edits(&src, &edits);
        let r = push(&["-H"]);
        r.ok();
        assert_trees_equal(&src, &far);
        assert_same_links(&src, &far, &r);

        for into in [&back, &src] {
            let r = ferry_ssh(&rsh, "sync", &[OsString::from("-H"), ssh_at(&host, &far), into.clone().into()]);
            r.ok();
            assert_trees_equal(&far, into);
            assert_same_links(&far, into, &r);
        }
    }
}

/// Two names of one file in SRC: `copy -n -H` reports the link and makes nothing, `-v`
/// names it `hardlink PATH -> FIRST` (FIRST: the name the parallel walk met first, either), `--json` has a `hardlink` record with its target and
/// the summary counts it; without -H DST gets two files.
#[test]
fn links_are_reported_and_without_h_names_are_separate_files() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "a/one", b"shared bytes");
    fs::create_dir_all(src.join("b")).unwrap();
    fs::hard_link(src.join("a/one"), src.join("b/two")).unwrap();

    let r = run_on("copy", &src, &dst, &["-H", "-n"]);
    r.ok();
    let out = r.out();
    assert!(
        out.contains("hardlink b/two -> a/one") || out.contains("hardlink a/one -> b/two"),
        "{r}"
    );
    assert!(!dst.exists(), "dry run made DST\n{r}");

    let r = run_on("copy", &src, &dst, &["-H", "--json"]);
    r.ok();
    let rec = json_lines(&r)
        .into_iter()
        .find(|l| l.str_field("type") == Some("hardlink"))
        .unwrap_or_else(|| panic!("no hardlink record\n{r}"));
    let pair = (rec.str_field("path"), rec.str_field("target"));
    assert!(
        pair == (Some("b/two"), Some("a/one")) || pair == (Some("a/one"), Some("b/two")),
        "{r}"
    );
    let s = summary(&r);
    assert_eq!((s.files_copied, s.hard_links), (1, 1), "{r}");
    assert_same_links(&src, &dst, &r);

    let plain = t.path().join("plain");
    let r = run_on("sync", &src, &plain, &["-v"]);
    r.ok();
    assert!(!r.out().contains("hardlink"), "{r}");
    let (x, y) = (
        fs::metadata(plain.join("a/one")).unwrap(),
        fs::metadata(plain.join("b/two")).unwrap(),
    );
    assert_ne!(x.ino(), y.ino(), "sync without -H linked DST\n{r}");
    assert_eq!((x.nlink(), y.nlink()), (1, 1), "{r}");
    assert_trees_equal(&src, &plain);
}

/// As user nobody (setpriv), on a tree nobody owns: links made, a link broken in SRC with
/// size and mtime kept is broken in DST, a link added is made, a rerun does nothing.
#[test]
fn sync_h_as_an_unprivileged_user() {
    if !is_root() {
        eprintln!("note: needs root to switch to user nobody: skipped");
        return;
    }
    let t = tmpdir();
    let base = t.path().join("home");
    fs::create_dir(&base).unwrap();
    let bin_copy = base.join("ferry");
    fs::copy(bin(), &bin_copy).unwrap();
    let (src, dst) = (base.join("src"), base.join("dst"));
    write(&src, "x/a", b"group one");
    write(&src, "y/b", b"group one");
    write(&src, "c", b"three names");
    fs::hard_link(src.join("x/a"), src.join("y/a2")).unwrap();
    fs::hard_link(src.join("c"), src.join("x/c2")).unwrap();
    fs::hard_link(src.join("c"), src.join("y/c3")).unwrap();
    set_mtime(&src.join("x/a"), (1_600_000_000, 5));
    set_mtime(&src.join("y/b"), (1_600_000_000, 5));
    chmod(t.path(), 0o755);
    let nobody = |p: &Path| {
        for e in walk(p)
            .into_iter()
            .map(|r| p.join(r))
            .chain([p.to_path_buf()])
        {
            lchown(&e, Some(65534), Some(65534)).unwrap();
        }
    };
    nobody(&base);
    let as_nobody = |args: &[&str]| -> Option<Run> {
        let o = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin_copy)
            .args(args)
            .arg(&src)
            .arg(&dst)
            .output()
            .ok()?;
        if String::from_utf8_lossy(&o.stderr).contains("setpriv:") {
            return None;
        }
        Some(Run {
            args: args.iter().map(Into::into).collect(),
            code: o.status.code(),
            stdout: o.stdout,
            stderr: o.stderr,
        })
    };
    let Some(r) = as_nobody(&["sync", "-H", "--json"]) else {
        eprintln!("note: cannot run as nobody (setpriv): skipped");
        return;
    };
    r.ok();
    assert_eq!(summary(&r).hard_links, 3, "{r}");
    assert_trees_equal(&src, &dst);
    assert_same_links(&src, &dst, &r);

    // x/c2 gets a file of its own (same bytes, mode, mtime); y/b joins x/a's file.
    let md = fs::metadata(src.join("x/c2")).unwrap();
    fs::remove_file(src.join("x/c2")).unwrap();
    write(&src, "x/c2", b"three names");
    set_mtime(&src.join("x/c2"), (md.mtime(), md.mtime_nsec() as u32));
    fs::remove_file(src.join("y/b")).unwrap();
    fs::hard_link(src.join("x/a"), src.join("y/b")).unwrap();
    nobody(&src);
    let r = as_nobody(&["sync", "-H", "--json"]).unwrap();
    r.ok();
    // One file copied: x/c2, or (when the walk met x/c2 first and kept DST's file for
    // it) c's group, whose other name is then linked again.
    let s = summary(&r);
    assert_eq!(s.files_copied, 1, "{r}");
    assert!((1..=2).contains(&s.hard_links), "{r}");
    assert_trees_equal(&src, &dst);
    assert_same_links(&src, &dst, &r);

    let before = snapshot(&dst);
    let r = as_nobody(&["sync", "-H", "--json"]).unwrap();
    r.ok();
    let s = summary(&r);
    assert_eq!((s.files_copied, s.hard_links, s.errors), (0, 0, 0), "{r}");
    assert_untouched(&before, &snapshot(&dst));
}

/// To S3 (no hard links) with -H: one note, every name uploaded as an object of its own.
#[test]
fn sync_h_to_s3_notes_once_and_copies_every_name() {
    let Some(s3) = s3() else {
        eprintln!("note: FERRY_SKIP_S3 set: skipped");
        return;
    };
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "a/one", b"first file");
    write(&src, "two", b"second file");
    for (from, to) in [("a/one", "b/one2"), ("a/one", "one3"), ("two", "a/two2")] {
        fs::create_dir_all(src.join(to).parent().unwrap()).unwrap();
        fs::hard_link(src.join(from), src.join(to)).unwrap();
    }
    let url = s3.url("hardlinks");
    let r = run(&[&"sync", &"-H", &"--json", &src, &url]);
    r.ok();
    let s = summary(&r);
    assert_eq!((s.files_copied, s.hard_links, s.errors), (5, 0, 0), "{r}");
    let notes = r
        .err()
        .lines()
        .filter(|l| l.contains("cannot store hard links"))
        .count();
    assert_eq!(notes, 1, "{r}");
    let back = t.path().join("back");
    run(&[&"copy", &url, &back]).ok();
    assert_files_equal(&src, &back);
    let r = run(&[&"sync", &"-H", &"--json", &src, &url]);
    r.ok();
    assert_eq!(summary(&r).files_copied, 0, "{r}");
}
