//! Filters (docs/CLI.md, "Filters"): --include, --filter-from, --min-size,
//! --max-size, --min-age, --max-age in copy, sync and bisync; the order of
//! the rules; what is left out is neither copied nor deleted; a property
//! test against an oracle of the rules.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::util::*;
use proptest::prelude::*;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A file with `len` bytes and an mtime (seconds).
fn put(root: &Path, rel: &str, len: usize, mtime: i64) -> PathBuf {
    let p = write(root, rel, &gen_bytes(len, len as u64 + rel.len() as u64));
    set_mtime(&p, (mtime, 0));
    p
}

fn files(root: &Path) -> Vec<String> {
    walk(root)
        .into_iter()
        .filter(|p| root.join(p).is_file())
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn size_rules_select_files_and_sync_keeps_larger_dst_files() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    put(&src, "small", 100, 1_600_000_000);
    put(&src, "d/edge", 1024, 1_600_000_000);
    put(&src, "d/big", 1025, 1_600_000_000);
    put(&src, "tiny", 9, 1_600_000_000);
    put(&dst, "big-dst-only", 5000, 1_600_000_000);
    put(&dst, "small-dst-only", 50, 1_600_000_000);
    put(&dst, "d/big", 3000, 1_500_000_000);
    let before = snapshot(&dst);
    run_on(
        "sync",
        &src,
        &dst,
        &["--min-size", "10", "--max-size", "1k"],
    )
    .ok();
    let mut got = files(&dst);
    got.sort();
    assert_eq!(got, ["big-dst-only", "d/big", "d/edge", "small"]);
    assert_trees_equal(&src.join("small"), &dst.join("small"));
    assert_trees_equal(&src.join("d/edge"), &dst.join("d/edge"));
    // Left out on SRC (too big): DST's file of that name is left alone,
    // and so is a DST-only file too big to be in the run.
    let after = snapshot(&dst);
    for k in ["d/big", "big-dst-only"] {
        let p = PathBuf::from(k);
        assert_eq!(before.get(&p), after.get(&p), "{k} was touched");
    }
}

#[test]
fn age_rules_with_durations_and_dates() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let n = now();
    put(&src, "hour", 10, n - 3600);
    put(&src, "d/week", 10, n - 8 * 86_400);
    put(&src, "d/year", 10, n - 400 * 86_400);
    mkdirs(&src, "old-dir");
    set_mtime(&src.join("old-dir"), (1_000_000_000, 0));
    run_on("copy", &src, &dst, &["--max-age", "7d"]).ok();
    assert_eq!(files(&dst), ["hour"]);
    // Directories are never left out for their mtime.
    assert!(dst.join("old-dir").is_dir() && dst.join("d").is_dir());

    let dst2 = t.path().join("dst2");
    run_on(
        "copy",
        &src,
        &dst2,
        &["--min-age", "1w", "--max-age", "30d"],
    )
    .ok();
    assert_eq!(files(&dst2), ["d/week"]);

    let dst3 = t.path().join("dst3");
    let cut = n - 100 * 86_400;
    let date = rfc3339(cut);
    run_on("copy", &src, &dst3, &["--min-age", &date]).ok();
    assert_eq!(files(&dst3), ["d/year"]);
}

#[test]
fn include_takes_only_matching_files() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    put(&src, "a.jpg", 5, 1_600_000_000);
    put(&src, "x/b.jpg", 5, 1_600_000_000);
    put(&src, "x/c.png", 5, 1_600_000_000);
    put(&dst, "x/dst.png", 5, 1_600_000_000);
    put(&dst, "x/gone.jpg", 5, 1_600_000_000);
    run_on("sync", &src, &dst, &["--include", "*.jpg"]).ok();
    let mut got = files(&dst);
    got.sort();
    // x/dst.png is not included: never deleted; x/gone.jpg is: deleted.
    assert_eq!(got, ["a.jpg", "x/b.jpg", "x/dst.png"]);
}

/// --include, then --exclude/--exclude-from, then --filter-from, then (with
/// --include) every other file left out; the first rule that matches decides.
#[test]
fn rule_order_include_exclude_filter_from() {
    let t = tmpdir();
    let src = t.path().join("src");
    for f in [
        "a.txt",
        "secret.txt",
        "b.log",
        "c.bak",
        "keep.bak",
        "cache/x.txt",
        "z.dat",
    ] {
        put(&src, f, 3, 1_600_000_000);
    }
    let ff = t.path().join("rules");
    fs::write(
        &ff,
        "# comment\n+ keep.bak\n- *.bak\n- secret.txt\n+ *.log\n- cache/**\n",
    )
    .unwrap();
    let ffs = ff.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        // --filter-from alone: first match wins, the rest is taken.
        (
            &["--filter-from", ffs],
            &["a.txt", "b.log", "keep.bak", "z.dat"],
        ),
        // --include comes before the file: secret.txt is taken although
        // the file leaves it out; with --include, unmatched files are out.
        (
            &["--include", "*.txt", "--filter-from", ffs],
            &["a.txt", "b.log", "keep.bak", "secret.txt"],
        ),
        // --exclude comes before --filter-from.
        (
            &["--exclude", "*.log", "--filter-from", ffs],
            &["a.txt", "keep.bak", "z.dat"],
        ),
        // --include before --exclude: an excluded but included file is in.
        (
            &[
                "--include",
                "*.txt",
                "--exclude",
                "secret.txt",
                "--exclude",
                "cache/",
            ],
            &["a.txt", "secret.txt"],
        ),
    ];
    for (i, (flags, want)) in cases.iter().enumerate() {
        let dst = t.path().join(format!("dst{i}"));
        run_on("copy", &src, &dst, flags).ok();
        let mut got = files(&dst);
        got.sort();
        assert_eq!(&got, want, "flags {flags:?}");
    }
}

/// A bad value is a usage error: exit 2, one line naming the flag and the value.
#[test]
fn bad_values_are_usage_errors_naming_flag_and_value() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    put(&src, "a", 1, 1_600_000_000);
    let ff = t.path().join("rules");
    fs::write(&ff, "+ ok\n*.bak\n").unwrap();
    let ffs = ff.to_str().unwrap().to_string();
    let cases: [(&str, &str, &str); 5] = [
        ("--max-size", "10Q", "10Q"),
        ("--min-size", "5X", "5X"),
        ("--max-age", "yesterday", "yesterday"),
        ("--min-age", "2026-13-01", "2026-13-01"),
        ("--filter-from", &ffs, "*.bak"),
    ];
    for cmd in ["copy", "sync", "bisync"] {
        for (flag, value, shown) in cases {
            let r = ferry([
                cmd,
                flag,
                value,
                src.to_str().unwrap(),
                dst.to_str().unwrap(),
            ]);
            r.code_is(2);
            let err = r.err();
            assert!(
                err.lines().any(|l| l.contains(flag) && l.contains(shown)),
                "{cmd} {flag} {value}: no line naming both\n{r}"
            );
            assert!(!dst.exists(), "{cmd} {flag} {value} created DST");
        }
    }
}

// ------------------------------------------------------------------------------------------
// bisync
// ------------------------------------------------------------------------------------------

fn bisync(a: &Path, b: &Path, j: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<String> = vec![
        "bisync".into(),
        "--journal".into(),
        j.to_string_lossy().into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(a.to_string_lossy().into());
    args.push(b.to_string_lossy().into());
    ferry(&args)
}

/// A file whose copy on one side is now out of the rules (older than
/// --max-age, larger than --max-size) is out of the run on both sides: the
/// other side's copy is not deleted, and not taken for a deletion later.
#[test]
fn bisync_file_out_of_the_rules_on_one_side_is_not_deleted_on_the_other() {
    let t = tmpdir();
    let (a, b, j) = (
        t.path().join("a"),
        t.path().join("b"),
        t.path().join("j.sqlite"),
    );
    fs::create_dir_all(&b).unwrap();
    let n = now();
    put(&a, "aged", 10, n - 3600);
    put(&a, "grown", 10, n - 3600);
    put(&a, "d/fresh", 10, n - 60);
    bisync(&a, &b, &j, &["--max-age", "1d", "--max-size", "1k"]).ok();
    assert_eq!(files(&b).len(), 3);

    // On A, "aged" gets an mtime past --max-age (same bytes) and "grown"
    // grows past --max-size; B's copies are in the rules as they were.
    set_mtime(&a.join("aged"), (n - 10 * 86_400, 0));
    put(&a, "grown", 5000, n - 60);
    let before = snapshot(&b);
    let r = bisync(
        &a,
        &b,
        &j,
        &["--max-age", "1d", "--max-size", "1k", "--json"],
    );
    r.ok();
    assert_eq!(
        snapshot_diffs(&before, &snapshot(&b), true),
        Vec::<String>::new(),
        "{r}"
    );
    assert!(a.join("aged").exists() && a.join("grown").exists());

    // Both copies of "aged" past --max-age: still left alone on both sides.
    set_mtime(&b.join("aged"), (n - 10 * 86_400, 0));
    let r = bisync(&a, &b, &j, &["--max-age", "1d", "--max-size", "1k"]);
    r.ok();
    assert!(a.join("aged").exists() && b.join("aged").exists(), "{r}");

    // Without the rules the changes on A are propagated, nothing deleted.
    let r = bisync(&a, &b, &j, &[]);
    r.ok();
    assert_eq!(files(&a), files(&b), "{r}");
    for f in files(&a) {
        assert_eq!(
            fs::read(a.join(&f)).unwrap(),
            fs::read(b.join(&f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(files(&b).len(), 3, "{r}");
}

#[test]
fn bisync_include_and_size() {
    let t = tmpdir();
    let (a, b, j) = (
        t.path().join("a"),
        t.path().join("b"),
        t.path().join("j.sqlite"),
    );
    fs::create_dir_all(&b).unwrap();
    put(&a, "x.txt", 10, 1_600_000_000);
    put(&a, "big.txt", 5000, 1_600_000_000);
    put(&a, "y.bin", 10, 1_600_000_000);
    put(&b, "z.txt", 10, 1_600_000_000);
    bisync(
        &a,
        &b,
        &j,
        &["--resync", "--include", "*.txt", "--max-size", "1K"],
    )
    .ok();
    let (mut fa, mut fb) = (files(&a), files(&b));
    fa.sort();
    fb.sort();
    assert_eq!(fa, ["big.txt", "x.txt", "y.bin", "z.txt"]);
    assert_eq!(fb, ["x.txt", "z.txt"]);
}

// ------------------------------------------------------------------------------------------
// Property: the destination holds exactly what the rules select
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct F {
    size: usize,
    mtime: i64,
}

#[derive(Debug, Clone)]
struct Rules {
    min_size: Option<u64>,
    max_size: Option<u64>,
    /// --max-age as a date (seconds).
    from: Option<i64>,
    /// --min-age as a date (seconds).
    to: Option<i64>,
    include_a: bool,
}

const BASE: i64 = 1_600_000_000;
const NAMES: [&str; 8] = [
    "f.a", "g.b", "d/h.a", "d/i", "d/e/j.a", "d/e/k", "m.b", "d/n.a",
];

fn rfc3339(secs: i64) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

impl Rules {
    fn flags(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut add = |f: &str, x: String| {
            v.push(f.to_string());
            v.push(x);
        };
        if let Some(s) = self.min_size {
            add("--min-size", s.to_string());
        }
        if let Some(s) = self.max_size {
            add("--max-size", s.to_string());
        }
        if let Some(s) = self.from {
            add("--max-age", rfc3339(s));
        }
        if let Some(s) = self.to {
            add("--min-age", rfc3339(s));
        }
        if self.include_a {
            add("--include", "*.a".into());
        }
        v
    }

    fn takes(&self, name: &str, f: &F) -> bool {
        let size = f.size as u64;
        self.min_size.is_none_or(|m| size >= m)
            && self.max_size.is_none_or(|m| size <= m)
            && self.from.is_none_or(|t| f.mtime >= t)
            && self.to.is_none_or(|t| f.mtime <= t)
            && (!self.include_a || name.ends_with(".a"))
    }
}

fn file() -> impl Strategy<Value = F> {
    (0usize..3000, 0i64..1000).prop_map(|(size, m)| F {
        size,
        mtime: BASE + m,
    })
}

fn rules() -> impl Strategy<Value = Rules> {
    (
        proptest::option::of(0u64..2000),
        proptest::option::of(500u64..3000),
        proptest::option::of(0i64..1000),
        proptest::option::of(0i64..1000),
        any::<bool>(),
    )
        .prop_map(|(min_size, max_size, from, to, include_a)| Rules {
            min_size,
            max_size,
            from: from.map(|x| BASE + x),
            to: to.map(|x| BASE + x),
            include_a,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A random tree on each side and random rules: after sync, DST holds
    /// SRC's version (byte for byte) of each file the rules take on SRC,
    /// keeps unchanged what they leave out (on SRC, or on DST for DST-only
    /// names), and has deleted DST-only files they take.
    #[test]
    fn sync_holds_exactly_what_the_rules_select(
        src_files in proptest::collection::vec(proptest::option::of(file()), NAMES.len()),
        dst_files in proptest::collection::vec(proptest::option::of(file()), NAMES.len()),
        r in rules(),
    ) {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        fs::create_dir_all(&src).unwrap();
        fs::create_dir_all(&dst).unwrap();
        let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (i, name) in NAMES.iter().enumerate() {
            let s = src_files[i].as_ref().map(|f| {
                let p = src.join(name);
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                let data = gen_bytes(f.size, i as u64);
                fs::write(&p, &data).unwrap();
                set_mtime(&p, (f.mtime, 0));
                (f, data)
            });
            let d = dst_files[i].as_ref().map(|f| {
                let p = dst.join(name);
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                let data = gen_bytes(f.size, 100 + i as u64);
                fs::write(&p, &data).unwrap();
                set_mtime(&p, (f.mtime, 0));
                (f, data)
            });
            let keep = match (&s, &d) {
                (Some((f, data)), _) if r.takes(name, f) => Some(data.clone()),
                (Some(_), d) => d.as_ref().map(|(_, data)| data.clone()),
                (None, Some((f, data))) if !r.takes(name, f) => Some(data.clone()),
                _ => None,
            };
            if let Some(k) = keep {
                want.insert(name.to_string(), k);
            }
        }
        // --force: the rules may leave SRC's top level empty, which sync
        // refuses against a DST with entries (an unmounted SRC looks so).
        let mut flags = r.flags();
        flags.push("--force".into());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        run_on("sync", &src, &dst, &flags).ok();
        let got: BTreeMap<String, Vec<u8>> = files(&dst)
            .into_iter()
            .map(|p| {
                let data = fs::read(dst.join(&p)).unwrap();
                (p, data)
            })
            .collect();
        prop_assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "rules {:?}", r
        );
        prop_assert!(got == want, "contents differ, rules {:?}", r);
    }
}
