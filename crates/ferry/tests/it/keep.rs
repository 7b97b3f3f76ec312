//! Keeping what copy and sync replace or delete (`--backup-dir`, `--suffix`,
//! `-b`, `--versions`): no version of a DST entry is ever lost.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::*;
use proptest::prelude::*;

/// The clock of versions in these tests (FERRY_TEST_NOW): 2026-11-25 16:33:43 UTC.
const NOW: &str = "1795624423";
const STAMP: &str = "20261125-163343";

// ------------------------------------------------------------------------------------------
// Random trees: paths over a small pool of names (so that SRC and DST share many, with
// type changes), files and symlinks.
// ------------------------------------------------------------------------------------------

const NAMES: &[&str] = &["a", "b.txt", "c", ".d", "e.tar.gz"];

#[derive(Clone, Debug)]
enum What {
    File { size: usize, seed: u64 },
    Link(u8),
}

fn entry() -> impl Strategy<Value = (Vec<u8>, What)> {
    let what = prop_oneof![
        4 => (0usize..600, any::<u64>()).prop_map(|(size, seed)| What::File { size, seed }),
        1 => (0u8..4).prop_map(What::Link),
    ];
    (
        proptest::collection::vec(0u8..NAMES.len() as u8, 1..4),
        what,
    )
}

fn tree() -> impl Strategy<Value = Vec<(Vec<u8>, What)>> {
    proptest::collection::vec(entry(), 0..14)
}

/// Make the entries under `root` (one that conflicts with an earlier one is left out), each
/// file with mtime `base` + its index.
fn build(root: &Path, spec: &[(Vec<u8>, What)], base: i64) {
    fs::create_dir_all(root).unwrap();
    let mut made: BTreeMap<PathBuf, bool> = BTreeMap::new(); // path -> is a dir
    'next: for (i, (comps, what)) in spec.iter().enumerate() {
        let mut rel = PathBuf::new();
        for (k, c) in comps.iter().enumerate() {
            rel.push(NAMES[*c as usize]);
            let last = k + 1 == comps.len();
            match made.get(&rel) {
                Some(true) if !last => continue,
                Some(_) => continue 'next,
                None if last => {}
                None => {
                    fs::create_dir(root.join(&rel)).unwrap();
                    made.insert(rel.clone(), true);
                }
            }
        }
        let p = root.join(&rel);
        match what {
            What::File { size, seed } => {
                fs::write(&p, gen_bytes(*size, *seed)).unwrap();
                set_mtime(&p, (base + i as i64, 0));
            }
            What::Link(t) => symlink(format!("target{t}"), &p).unwrap(),
        }
        made.insert(rel, false);
    }
}

// ------------------------------------------------------------------------------------------
// Where a kept entry is
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// `--backup-dir bak` (inside DST).
    Inside,
    /// `--backup-dir ../out` (beside DST).
    Outside,
    /// `--backup-dir /abs/path`.
    Absolute,
    /// `--suffix .old`.
    Suffix,
    /// `-b`.
    Backup,
    /// `--versions`.
    Versions,
}

const MODES: [Mode; 6] = [
    Mode::Inside,
    Mode::Outside,
    Mode::Absolute,
    Mode::Suffix,
    Mode::Backup,
    Mode::Versions,
];

fn mode_args(m: Mode, top: &Path) -> Vec<String> {
    match m {
        Mode::Inside => vec!["--backup-dir".into(), "bak".into()],
        Mode::Outside => vec!["--backup-dir".into(), "../out".into()],
        Mode::Absolute => vec![
            "--backup-dir".into(),
            top.join("abs/kept").display().to_string(),
        ],
        Mode::Suffix => vec!["--suffix".into(), ".old".into()],
        Mode::Backup => vec!["-b".into()],
        Mode::Versions => vec!["--versions".into()],
    }
}

/// The name of a version of `name` (stem~STAMP.ext).
fn version_name(name: &str) -> String {
    match name.rfind('.') {
        Some(i) if i > 0 => format!("{}~{STAMP}{}", &name[..i], &name[i..]),
        _ => format!("{name}~{STAMP}"),
    }
}

/// Where the DST entry at `rel` is kept.
fn kept_at(m: Mode, top: &Path, dst: &Path, rel: &Path) -> PathBuf {
    let s = rel.to_str().unwrap();
    match m {
        Mode::Inside => dst.join("bak").join(rel),
        Mode::Outside => top.join("out").join(rel),
        Mode::Absolute => top.join("abs/kept").join(rel),
        Mode::Suffix => dst.join(format!("{s}.old")),
        Mode::Backup => dst.join(format!("{s}~")),
        Mode::Versions => {
            let name = rel.file_name().unwrap().to_str().unwrap();
            let dir = rel.parent().unwrap_or(Path::new(""));
            dst.join(".ferry-versions")
                .join(dir)
                .join(version_name(name))
        }
    }
}

/// True for a DST path that is not part of the synced tree in mode `m`.
fn is_keep_area(m: Mode, rel: &Path) -> bool {
    let s = rel.to_str().unwrap();
    match m {
        Mode::Inside => rel.starts_with("bak"),
        Mode::Versions => rel.starts_with(".ferry-versions"),
        Mode::Suffix => s.ends_with(".old"),
        Mode::Backup => s.ends_with('~'),
        Mode::Outside | Mode::Absolute => false,
    }
}

/// Same file or symlink: kind, content, target, mtime, mode.
fn same_version(a: &Entry, b: &Entry) -> bool {
    a.kind == b.kind
        && a.size == b.size
        && a.hash == b.hash
        && a.target == b.target
        && a.mode == b.mode
        && (a.kind != Kind::File || a.mtime_ns == b.mtime_ns)
}

/// Every file and symlink of `before` (DST before the run) is in DST unchanged or at its
/// kept path.
#[track_caller]
fn assert_nothing_lost(m: Mode, top: &Path, dst: &Path, before: &Snapshot, run: &Run) {
    for (rel, e) in before {
        if e.kind == Kind::Dir {
            continue;
        }
        let now = fs::symlink_metadata(dst.join(rel))
            .ok()
            .map(|_| snapshot(&dst.join(rel))[Path::new("")].clone());
        if now.as_ref().is_some_and(|n| same_version(e, n)) {
            continue;
        }
        let k = kept_at(m, top, dst, rel);
        let kept = fs::symlink_metadata(&k)
            .ok()
            .map(|_| snapshot(&k)[Path::new("")].clone());
        assert!(
            kept.as_ref().is_some_and(|x| same_version(e, x)),
            "{m:?}: {} lost: not in DST unchanged ({now:?}) nor at {} ({kept:?}); was {e:?}\n{run}",
            rel.display(),
            k.display()
        );
    }
}

/// DST equals SRC, leaving out the keep area (and, with a suffix, directories that stay only
/// because backups are inside).
#[track_caller]
fn assert_synced(m: Mode, src: &Path, dst: &Path, run: &Run) {
    let s = snapshot(src);
    let mut d = snapshot(dst);
    d.retain(|rel, _| !is_keep_area(m, rel));
    let kept_only: Vec<PathBuf> = d
        .iter()
        .filter(|(rel, e)| e.kind == Kind::Dir && !s.contains_key(*rel))
        .filter(|(rel, _)| {
            !d.iter()
                .any(|(k, e)| e.kind != Kind::Dir && k.starts_with(rel))
        })
        .map(|(rel, _)| rel.clone())
        .collect();
    for k in kept_only {
        d.remove(&k);
    }
    let mut s2 = s.clone();
    // The root's mtime may differ when a kept directory stays inside it.
    s2.remove(Path::new(""));
    d.remove(Path::new(""));
    let diffs = snapshot_diffs(&s2, &d, false);
    assert!(
        diffs.is_empty(),
        "{m:?}: DST differs from SRC:\n{}\n{run}",
        diffs.join("\n")
    );
}

fn sync_keeping(m: Mode, top: &Path, src: &Path, dst: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<String> = vec!["sync".into(), "--force".into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(mode_args(m, top));
    args.push(src.display().to_string());
    args.push(dst.display().to_string());
    let mut c = std::process::Command::new(bin());
    c.args(&args).env("FERRY_TEST_NOW", NOW);
    run_within(c, Duration::from_secs(300))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn sync_loses_no_version(src_spec in tree(), dst_spec in tree(), mi in 0usize..MODES.len()) {
        let m = MODES[mi];
        let t = tmpdir();
        let top = t.path();
        let (src, dst) = (top.join("src"), top.join("dst"));
        build(&src, &src_spec, 1_700_000_000);
        build(&dst, &dst_spec, 1_600_000_000);
        let before = snapshot(&dst);
        let r = sync_keeping(m, top, &src, &dst, &["--json"]);
        // With the kept entry beside it, a directory that holds kept entries cannot give
        // way to a file: that one entry fails, nothing is lost.
        let suffix = matches!(m, Mode::Suffix | Mode::Backup);
        if !suffix {
            r.ok();
        }
        assert_nothing_lost(m, top, &dst, &before, &r);
        if r.code == Some(0) {
            assert_synced(m, &src, &dst, &r);
        }
        // The summary counts what the records say was kept.
        let kept = json_lines(&r)
            .iter()
            .filter(|l| l.str_field("type") == Some("keep"))
            .count() as u64;
        let last = json_lines(&r).pop().unwrap();
        prop_assert_eq!(last.get("files_kept").and_then(|v| v.as_u64()), Some(kept));
        // A second run keeps nothing more and changes nothing.
        if r.code == Some(0) {
            let again = sync_keeping(m, top, &src, &dst, &["--json"]);
            again.ok();
            let last = json_lines(&again).pop().unwrap();
            prop_assert_eq!(last.get("files_kept").and_then(|v| v.as_u64()), Some(0));
        }
    }
}

fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "a", b"new a");
    write(&src, "d/b", b"new b");
    write(&dst, "a", b"old a!");
    write(&dst, "d/b", b"old b!");
    write(&dst, "gone", b"to delete");
    set_mtime(&dst.join("a"), (1_600_000_000, 0));
    (t, src, dst)
}

#[test]
fn copy_keeps_what_it_replaces_and_deletes_nothing() {
    let (t, src, dst) = setup();
    let r = run_on(
        "copy",
        &src,
        &dst,
        &["--json", "--backup-dir", "../bak", "-v"],
    );
    r.ok();
    assert_eq!(fs::read(dst.join("a")).unwrap(), b"new a");
    assert_eq!(fs::read(t.path().join("bak/a")).unwrap(), b"old a!");
    assert_eq!(fs::read(t.path().join("bak/d/b")).unwrap(), b"old b!");
    assert_eq!(get_mtime(&t.path().join("bak/a")), (1_600_000_000, 0));
    assert!(dst.join("gone").exists() && !t.path().join("bak/gone").exists());
    let keeps: Vec<_> = json_lines(&r)
        .into_iter()
        .filter(|l| l.str_field("type") == Some("keep"))
        .collect();
    assert_eq!(keeps.len(), 2, "{r}");
    assert!(keeps.iter().any(|l| l.str_field("path") == Some("a")
        && l.str_field("to").is_some_and(|to| to.ends_with("/bak/a"))));
    let last = json_lines(&r).pop().unwrap();
    assert_eq!(last.get("files_kept").and_then(|v| v.as_u64()), Some(2));
    assert_eq!(last.get("bytes_kept").and_then(|v| v.as_u64()), Some(12));
}

#[test]
fn single_file_copy_keeps_the_file_it_replaces() {
    let (_t, src, dst) = setup();
    run_on(
        "copy",
        &src.join("a"),
        &dst.join("a"),
        &["--suffix", ".prev"],
    )
    .ok();
    assert_eq!(fs::read(dst.join("a")).unwrap(), b"new a");
    assert_eq!(fs::read(dst.join("a.prev")).unwrap(), b"old a!");
}

#[test]
fn dry_run_says_what_it_would_keep_and_changes_nothing() {
    let (t, src, dst) = setup();
    let before = snapshot(t.path());
    let r = ferry([
        "sync".as_ref(),
        "-n".as_ref(),
        "--json".as_ref(),
        "--backup-dir".as_ref(),
        "../bak".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ]);
    r.ok();
    assert_untouched(&before, &snapshot(t.path()));
    let acts = actions(&r);
    assert!(
        has_action(&acts, "keep", "a") && has_action(&acts, "keep", "gone"),
        "{r}"
    );
}

#[test]
fn a_failed_keep_leaves_the_entry_alone_and_exits_1() {
    let (t, src, dst) = setup();
    // A file where the backup directory's subdirectory must go.
    write(t.path(), "bak/d", b"in the way");
    let r = ferry([
        "sync".as_ref(),
        "--backup-dir".as_ref(),
        "../bak".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ]);
    r.code_is(1);
    assert_eq!(fs::read(dst.join("d/b")).unwrap(), b"old b!", "{r}");
    let lines = r.error_lines();
    assert_eq!(lines.len(), 1, "{r}");
    assert!(
        lines[0].contains("d/b") && lines[0].contains("bak/d/b"),
        "{r}"
    );
    // The rest went on: a replaced and kept, gone deleted and kept.
    assert_eq!(fs::read(dst.join("a")).unwrap(), b"new a");
    assert_eq!(fs::read(t.path().join("bak/a")).unwrap(), b"old a!");
    assert!(!dst.join("gone").exists());
    assert_eq!(fs::read(t.path().join("bak/gone")).unwrap(), b"to delete");
}

#[test]
fn versions_dir_is_never_synced() {
    let (_t, src, dst) = setup();
    write(&src, ".ferry-versions/x", b"src version");
    write(&src, "d/.ferry-versions/y", b"nested");
    write(&dst, ".ferry-versions/old~20200101-000000", b"dst version");
    let r = run_on("sync", &src, &dst, &["--json"]);
    r.ok();
    assert!(!dst.join(".ferry-versions/x").exists());
    assert!(!dst.join("d/.ferry-versions").exists());
    assert_eq!(
        fs::read(dst.join(".ferry-versions/old~20200101-000000")).unwrap(),
        b"dst version"
    );
    assert!(!r.out().contains(".ferry-versions"), "{r}");
}

#[test]
fn usage_errors_exit_2_before_any_change() {
    let (t, src, dst) = setup();
    let before = snapshot(t.path());
    for bad in [
        &["--suffix", "a/b"][..],
        &["--versions", "--backup-dir", "x"][..],
        &["--keep", "3"][..],
        // Another backend than DST: keeping would need a download.
        &["--backup-dir", "s3://bucket/old"][..],
        &["--backup-dir", "otherhost:old"][..],
        // DST itself.
        &["--backup-dir", "."][..],
    ] {
        let mut args: Vec<&std::ffi::OsStr> = vec!["sync".as_ref()];
        args.extend(bad.iter().map(std::ffi::OsStr::new));
        args.push(src.as_os_str());
        args.push(dst.as_os_str());
        let r = ferry(&args);
        r.code_is(2);
        if bad[0] == "--backup-dir" && bad.len() == 2 {
            // ferry's own refusals are one line (clap's usage errors are its own).
            assert_eq!(r.err().trim_end().lines().count(), 1, "one line: {r}");
        }
    }
    assert_untouched(&before, &snapshot(t.path()));
}

/// Names with a newline and bytes that are not UTF-8 are kept like any
/// other (--backup-dir and --versions), and the -v line escapes them.
#[test]
fn odd_names_are_kept_byte_exact() {
    use std::os::unix::ffi::OsStrExt;
    let odd = std::ffi::OsStr::from_bytes(b"new\nline \xff\xfe.txt");
    for (flags, kept) in [
        (&["--backup-dir", "../old"][..], None),
        (&["--versions"][..], Some(())),
    ] {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        write(&src, odd, b"new bytes, longer");
        write(&dst, odd, b"old bytes");
        write(&dst, std::ffi::OsStr::from_bytes(b"gone\xff"), b"deleted");
        let mut args: Vec<&std::ffi::OsStr> = vec!["sync".as_ref(), "-v".as_ref()];
        args.extend(flags.iter().map(std::ffi::OsStr::new));
        args.push(src.as_os_str());
        args.push(dst.as_os_str());
        let r = ferry(&args);
        r.ok();
        assert_eq!(fs::read(dst.join(odd)).unwrap(), b"new bytes, longer");
        let mut old: Vec<Vec<u8>> = match kept {
            None => ["old".to_string()]
                .iter()
                .flat_map(|d| fs::read_dir(t.path().join(d)).unwrap())
                .map(|e| fs::read(e.unwrap().path()).unwrap())
                .collect(),
            Some(()) => fs::read_dir(dst.join(".ferry-versions"))
                .unwrap()
                .map(|e| fs::read(e.unwrap().path()).unwrap())
                .collect(),
        };
        old.sort();
        assert_eq!(old, vec![b"deleted".to_vec(), b"old bytes".to_vec()], "{r}");
        let out = String::from_utf8_lossy(&r.stdout).to_string() + &r.err();
        assert!(
            out.lines()
                .any(|l| l.starts_with("keep ") && l.contains("\\n")),
            "{r}"
        );
    }
}

/// kill -9 during a sync that replaces many files with --backup-dir: every old version is
/// in DST or in the backup directory, and a rerun completes.
#[test]
fn kill_9_with_backup_dir_loses_no_version() {
    let t = tmpdir();
    let (src, dst, bak) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("bak"),
    );
    let mut rng = crate::util::Rng::new(17);
    for i in 0..1500 {
        let rel = format!("d{}/f{i}", i % 30);
        write(&dst, &rel, &gen_bytes(2000 + i, i as u64));
        set_mtime(&dst.join(&rel), (1_600_000_000, 0));
        write(&src, &rel, &gen_bytes(2000 + i, i as u64 + 99_999));
    }
    for i in 0..200 {
        write(&dst, format!("del{}/g{i}", i % 7), &gen_bytes(500, i));
    }
    let before = snapshot(&dst);
    for round in 0..4 {
        let child = spawn_ferry([
            "sync".as_ref(),
            "--backup-dir".as_ref(),
            bak.as_os_str(),
            "-j".as_ref(),
            "2".as_ref(),
            src.as_os_str(),
            dst.as_os_str(),
        ]);
        // The random moment of the kill (what the test is about), not a wait.
        std::thread::sleep(Duration::from_millis(5 + rng.next_u64() % 60));
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        // After each kill: every old version still somewhere.
        for (rel, e) in &before {
            if e.kind != Kind::File {
                continue;
            }
            let in_dst = fs::read(dst.join(rel)).ok().map(|d| fingerprint(&d));
            let in_bak = fs::read(bak.join(rel)).ok().map(|d| fingerprint(&d));
            assert!(
                in_dst == Some(e.hash) || in_bak == Some(e.hash),
                "round {round}: old {} lost",
                rel.display()
            );
        }
    }
    let r = ferry([
        "sync".as_ref(),
        "--backup-dir".as_ref(),
        bak.as_os_str(),
        src.as_os_str(),
        dst.as_os_str(),
    ]);
    r.ok();
    assert_trees_equal(&src, &dst);
    for (rel, e) in &before {
        if e.kind == Kind::File {
            let k = fs::read(bak.join(rel)).unwrap_or_default();
            assert_eq!(fingerprint(&k), e.hash, "{} not kept", rel.display());
        }
    }
}
