//! Property tests against a real S3 server (the single-node Garage of `scripts/test`, see
//! tests/s3.rs): random trees and random edits go up to S3, across S3 and back down, and
//! every file must come back with the same bytes, mtime (ns) and mode. Each case uses a
//! fresh prefix. What S3 cannot hold is left out of the trees: symlinks and names that are
//! not UTF-8; empty directories may be generated but are not compared (S3 has none).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::util::s3::*;
use crate::util::*;
use proptest::prelude::*;
use proptest::sample::Index;

// ------------------------------------------------------------------------------------------
// Trees
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Spec {
    File { size: usize, seed: u64, meta: Meta },
    Dir { kids: BTreeMap<String, Spec> },
}

fn to_node(s: &Spec) -> Node {
    match s {
        Spec::File { size, seed, meta } => Node::File {
            data: gen_bytes(*size, *seed),
            meta: meta.clone(),
        },
        Spec::Dir { kids } => Node::Dir {
            entries: kids.iter().map(|(n, k)| (n.into(), to_node(k))).collect(),
            meta: Meta::new(0o755, (1_600_000_000, 0)),
        },
    }
}

/// Names whose keys sort differently from the names (`a/` after `a b`, `a+`, `a-`, `a.txt`
/// in a listing; `a` first in a directory), and names that need escaping in URLs, headers
/// or XML.
const SUFFIXES: &[&str] = &[
    " ",
    " x",
    "+",
    "-",
    ".txt",
    "%",
    "%20",
    "~",
    "!",
    "\u{e9}",
    "\u{65e5}\u{672c}",
    "(1)",
    "#",
    "&",
    "=",
    "@",
    ",",
    ";",
    "$",
];

const ODD_NAMES: &[&str] = &[
    "with space",
    "\u{fc}n\u{ef}c\u{f8}d\u{e9}",
    "\u{65e5}\u{672c}\u{8a9e}.txt",
    "emoji \u{1f600}",
    " leading",
    "trailing ",
    "100%",
    "a+b",
    "..dots",
    ".hidden",
    "-dash",
    "quote\"'",
    "star*?[x]",
    "back\\slash",
    "<xml>&amp;",
    "UPPER",
];

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-c]{1,2}",
        4 => ("[a-c]{1,2}", prop::sample::select(SUFFIXES)).prop_map(|(a, b)| a + b),
        2 => prop::sample::select(ODD_NAMES).prop_map(str::to_owned),
        // Long, but a path of five of them stays under what Garage's LMDB stores in a key
        // (~511 bytes with the bucket id: longer ones are refused with HTTP 503).
        1 => "[a-z0-9_]{40,80}",
    ]
}

/// 8 MiB is ferry's multipart part size: exactly one part, and one byte more (two parts).
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => Just(0usize),
        2 => Just(1usize),
        8 => 2usize..3000,
        2 => Just(4096usize),
        1 => Just(65_536usize),
        1 => Just(8usize << 20),
        1 => Just((8usize << 20) + 1),
    ]
}

fn mtime() -> impl Strategy<Value = Mtime> {
    (1_000_000_000i64..1_900_000_000, 0u32..1_000_000_000)
}

const FILE_MODES: &[u32] = &[0o644, 0o600, 0o640, 0o755, 0o444, 0o700, 0o400, 0o664];

fn file_meta() -> impl Strategy<Value = Meta> {
    (prop::sample::select(FILE_MODES), mtime()).prop_map(|(mode, mtime)| Meta::new(mode, mtime))
}

fn leaf() -> impl Strategy<Value = Spec> {
    (size(), any::<u64>(), file_meta()).prop_map(|(size, seed, meta)| Spec::File {
        size,
        seed,
        meta,
    })
}

fn tree() -> impl Strategy<Value = Spec> {
    let sub = leaf().prop_recursive(3, 40, 6, |inner| {
        prop::collection::btree_map(name(), inner, 0..6).prop_map(|kids| Spec::Dir { kids })
    });
    prop::collection::btree_map(name(), sub, 0..10).prop_map(|kids| Spec::Dir { kids })
}

// ------------------------------------------------------------------------------------------
// Edits
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Edit {
    /// New content (same size or another size) and a new mtime.
    Rewrite {
        same_size: bool,
        size: usize,
        seed: u64,
        mtime: Mtime,
    },
    /// Only the mtime changes (S3: metadata-only update).
    Touch { mtime: Mtime },
    /// Only the permission bits change (S3: metadata-only update).
    Chmod { mode: u32 },
    /// A file or a whole directory goes.
    Delete,
    AddFile {
        name: String,
        size: usize,
        seed: u64,
        meta: Meta,
    },
    /// A file becomes a directory of the same name, or a directory a file.
    Replace { size: usize, seed: u64, meta: Meta },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<bool>(), size(), any::<u64>(), mtime()).prop_map(
            |(same_size, size, seed, mtime)| Edit::Rewrite {
                same_size,
                size,
                seed,
                mtime
            }
        ),
        mtime().prop_map(|mtime| Edit::Touch { mtime }),
        prop::sample::select(FILE_MODES).prop_map(|mode| Edit::Chmod { mode }),
        Just(Edit::Delete),
        (name(), size(), any::<u64>(), file_meta()).prop_map(|(name, size, seed, meta)| {
            Edit::AddFile {
                name,
                size,
                seed,
                meta,
            }
        }),
        (size(), any::<u64>(), file_meta()).prop_map(|(size, seed, meta)| Edit::Replace {
            size,
            seed,
            meta
        }),
    ]
}

fn new_file(p: &Path, size: usize, seed: u64, meta: &Meta) {
    materialize(
        p,
        &Node::File {
            data: gen_bytes(size, seed),
            meta: meta.clone(),
        },
    );
}

/// Apply `edits` to the tree at `root`; each picks its target among the current entries.
fn apply_edits(root: &Path, edits: &[(Index, Edit)]) {
    for (idx, e) in edits {
        let entries = walk(root);
        if let Edit::AddFile {
            name,
            size,
            seed,
            meta,
        } = e
        {
            let mut dirs = vec![PathBuf::new()];
            dirs.extend(entries.into_iter().filter(|p| root.join(p).is_dir()));
            let p = root.join(&dirs[idx.index(dirs.len())]).join(name);
            if fs::symlink_metadata(&p).is_err() {
                new_file(&p, *size, *seed, meta);
            }
            continue;
        }
        if entries.is_empty() {
            continue;
        }
        let p = root.join(&entries[idx.index(entries.len())]);
        let is_file = p.is_file();
        let old_mtime = get_mtime(&p);
        match e {
            Edit::Rewrite {
                same_size,
                size,
                seed,
                mtime,
            } if is_file => {
                let old = fs::read(&p).unwrap();
                let mut data = if *same_size {
                    gen_bytes(old.len(), *seed)
                } else {
                    gen_bytes(*size, *seed)
                };
                if data == old && !data.is_empty() {
                    data[0] ^= 1;
                }
                rewrite_keep_meta(&p, &data);
                set_mtime(&p, differ(*mtime, old_mtime));
            }
            Edit::Touch { mtime } if is_file => set_mtime(&p, differ(*mtime, old_mtime)),
            Edit::Chmod { mode } if is_file => chmod(&p, *mode),
            Edit::Delete => {
                if is_file {
                    fs::remove_file(&p).unwrap();
                } else {
                    fs::remove_dir_all(&p).unwrap();
                }
            }
            Edit::Replace { size, seed, meta } => {
                if is_file {
                    fs::remove_file(&p).unwrap();
                    fs::create_dir(&p).unwrap();
                    new_file(&p.join("inner"), *size, *seed, meta);
                } else {
                    fs::remove_dir_all(&p).unwrap();
                    new_file(&p, *size, *seed, meta);
                }
            }
            _ => {}
        }
    }
}

// ------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------

/// 10 cases a property (`PROPTEST_CASES=N` for a longer hunt).
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
        max_shrink_iters: 30,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn jobs_flags(j: u8) -> Vec<&'static str> {
    match j % 3 {
        0 => vec![],
        1 => vec!["-j", "1"],
        _ => vec!["-j", "8"],
    }
}

/// `ferry CMD --json [flags] SRC DST`: exit 0, no errors; the summary.
#[track_caller]
fn transfer(
    cmd: &str,
    flags: &[&str],
    src: &dyn AsRef<std::ffi::OsStr>,
    dst: &dyn AsRef<std::ffi::OsStr>,
) -> Summary {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&cmd, &"--json"];
    for f in flags {
        args.push(f);
    }
    // A generated tree without files leaves no object: its prefix does not exist, and
    // a SRC prefix that does not exist is refused unless --force (s3_semantics.rs). Random
    // edits can also empty SRC, and a sync from an empty SRC over a DST with entries is
    // refused unless --force (the guard has its own tests): these tests check equality.
    if cmd == "sync"
        || src
            .as_ref()
            .to_str()
            .is_some_and(|s| s.starts_with("s3://"))
    {
        args.push(&"--force");
    }
    args.push(src);
    args.push(dst);
    let r = run(&args);
    r.ok();
    let s = summary(&r);
    assert_eq!(s.errors, 0, "{r}");
    s
}

/// A run that found nothing to do.
#[track_caller]
fn assert_no_work(s: &Summary, what: &str) {
    assert_eq!(
        (s.files_copied, s.bytes_copied, s.files_deleted),
        (0, 0, 0),
        "{what}: {s:?}"
    );
}

/// Directories (relative paths) under `root` that hold at least one file somewhere below.
fn dirs_with_files(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for (p, ..) in file_list(root) {
        let mut d = p.parent();
        while let Some(x) = d.filter(|x| !x.as_os_str().is_empty()) {
            out.insert(x.to_path_buf());
            d = x.parent();
        }
    }
    out
}

/// `ferry ls --json URL` lists exactly the files under `src` (size, mtime, mode) and the
/// directories that hold them.
#[track_caller]
fn assert_ls_matches(url: &str, src: &Path) {
    let r = run(&[&"ls", &"--json", &url]);
    r.ok();
    let mut files = BTreeMap::new();
    let mut dirs = BTreeSet::new();
    for j in json_lines(&r) {
        let path = PathBuf::from(j.str_field("path").expect("path"));
        match j.str_field("kind") {
            Some("file") => {
                let n = |k: &str| j.get(k).and_then(Json::as_i128).expect(k);
                let prev = files.insert(path.clone(), (n("size"), n("mtime_ns"), n("mode")));
                assert!(prev.is_none(), "{path:?} listed twice\n{r}");
            }
            Some("dir") => {
                assert!(dirs.insert(path.clone()), "{path:?} listed twice\n{r}");
            }
            k => panic!("{path:?}: kind {k:?} on S3\n{r}"),
        }
    }
    let want: BTreeMap<PathBuf, (i128, i128, i128)> = file_list(src)
        .into_iter()
        .map(|(p, data, mtime, mode)| (p, (data.len() as i128, mtime_ns(mtime), i128::from(mode))))
        .collect();
    assert_eq!(files, want, "ferry ls --json {url}: files");
    assert_eq!(
        dirs,
        dirs_with_files(src),
        "ferry ls --json {url}: directories"
    );
}

// ------------------------------------------------------------------------------------------
// Properties
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// copy or sync up to a fresh prefix, then down into a fresh directory: every file comes
    /// back equal (bytes, mtime, mode); `ls` lists exactly the files with their sizes and
    /// mtimes; repeating either transfer copies nothing.
    #[test]
    fn local_to_s3_to_local_round_trip(spec in tree(), up_sync in any::<bool>(), down_sync in any::<bool>(), j in any::<u8>()) {
        let Some(s3) = s3() else { return Ok(()) };
        let t = tmpdir();
        let src = t.path().join("src");
        materialize(&src, &to_node(&spec));
        let nfiles = file_list(&src).len() as u64;
        let url = s3.url("prop-roundtrip");
        let flags = jobs_flags(j);
        let (up, down_cmd) = (if up_sync { "sync" } else { "copy" }, if down_sync { "sync" } else { "copy" });

        let s = transfer(up, &flags, &src, &url);
        prop_assert_eq!(s.files_copied, nfiles);
        assert_ls_matches(&url, &src);

        let down = t.path().join("down");
        transfer(down_cmd, &flags, &url, &down);
        assert_files_equal(&src, &down);
        prop_assert_eq!(dirs_with_files(&down), dirs_with_files(&src));

        assert_no_work(&transfer(up, &flags, &src, &url), "second upload");
        assert_no_work(&transfer(down_cmd, &flags, &url, &down), "second download");
        assert_files_equal(&src, &down);
    }

    /// After random edits of SRC (new content, new mtime only, new mode only, deletions,
    /// new files, files turned into directories and back) a sync up leaves S3 equal to SRC:
    /// a fresh download equals SRC, and so does the earlier download once synced again
    /// (its vanished directories gone too). A further sync up does nothing.
    #[test]
    fn sync_to_s3_after_random_edits_makes_s3_equal_to_src(
        spec in tree(),
        edits in prop::collection::vec((any::<Index>(), edit()), 1..10),
        j in any::<u8>(),
    ) {
        let Some(s3) = s3() else { return Ok(()) };
        let t = tmpdir();
        let src = t.path().join("src");
        materialize(&src, &to_node(&spec));
        let url = s3.url("prop-edits");
        let flags = jobs_flags(j);
        transfer("sync", &flags, &src, &url);
        let down1 = t.path().join("down1");
        transfer("sync", &flags, &url, &down1);
        assert_files_equal(&src, &down1);

        apply_edits(&src, &edits);
        transfer("sync", &flags, &src, &url);
        assert_ls_matches(&url, &src);
        let down2 = t.path().join("down2");
        transfer("sync", &flags, &url, &down2);
        assert_files_equal(&src, &down2);
        transfer("sync", &flags, &url, &down1);
        assert_files_equal(&src, &down1);
        let dirs = |root: &Path| -> BTreeSet<PathBuf> {
            walk(root).into_iter().filter(|p| root.join(p).is_dir()).collect()
        };
        prop_assert_eq!(dirs(&down1), dirs_with_files(&src), "directories after the incremental download");

        assert_no_work(&transfer("sync", &flags, &src, &url), "sync up after sync up");
    }

    /// S3 to S3: copy into a fresh prefix reproduces every object; after random edits
    /// uploaded to the first prefix, a sync between the prefixes makes the second equal
    /// again, and a repeated sync does nothing.
    #[test]
    fn s3_to_s3_copy_and_sync_reproduce_the_tree(
        spec in tree(),
        edits in prop::collection::vec((any::<Index>(), edit()), 1..6),
        j in any::<u8>(),
    ) {
        let Some(s3) = s3() else { return Ok(()) };
        let t = tmpdir();
        let src = t.path().join("src");
        materialize(&src, &to_node(&spec));
        let a = s3.url("prop-s2s-a");
        let b = s3.url("prop-s2s-b");
        let flags = jobs_flags(j);
        transfer("sync", &flags, &src, &a);
        let s = transfer("copy", &flags, &a, &b);
        prop_assert_eq!(s.files_copied, file_list(&src).len() as u64);
        assert_ls_matches(&b, &src);
        let down = t.path().join("down");
        transfer("sync", &flags, &b, &down);
        assert_files_equal(&src, &down);

        apply_edits(&src, &edits);
        transfer("sync", &flags, &src, &a);
        transfer("sync", &flags, &a, &b);
        assert_ls_matches(&b, &src);
        let down2 = t.path().join("down2");
        transfer("sync", &flags, &b, &down2);
        assert_files_equal(&src, &down2);
        assert_no_work(&transfer("sync", &flags, &a, &b), "second S3-to-S3 sync");
    }
}
