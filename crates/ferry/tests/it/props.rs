//! Property tests: random trees, random edits; copy and sync must reproduce SRC exactly.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};

use crate::util::*;
use proptest::prelude::*;
use proptest::sample::Index;

// ------------------------------------------------------------------------------------------
// Tree specs
// ------------------------------------------------------------------------------------------

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Name(Vec<u8>);

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

impl Name {
    fn os(&self) -> &OsStr {
        OsStr::from_bytes(&self.0)
    }
}

#[derive(Clone, Debug)]
enum Spec {
    File {
        size: usize,
        seed: u64,
        meta: Meta,
    },
    Link {
        target: Name,
        meta: Meta,
    },
    Dir {
        kids: BTreeMap<Name, Spec>,
        meta: Meta,
    },
}

fn to_node(s: &Spec) -> Node {
    match s {
        Spec::File { size, seed, meta } => Node::File {
            data: gen_bytes(*size, *seed),
            meta: meta.clone(),
        },
        Spec::Link { target, meta } => Node::Symlink {
            target: target.os().to_owned(),
            meta: meta.clone(),
        },
        Spec::Dir { kids, meta } => Node::Dir {
            entries: kids
                .iter()
                .map(|(n, k)| (n.os().to_owned(), to_node(k)))
                .collect(),
            meta: meta.clone(),
        },
    }
}

const ODD_NAMES: &[&[u8]] = &[
    b"with space",
    "ünïcødé".as_bytes(),
    "日本語.txt".as_bytes(),
    b"new\nline",
    b"-dash",
    b"--help",
    b".hidden",
    b"tab\there",
    b"back\\slash",
    b"star*?[x]",
    b"UPPER",
    b"a.b.c",
    b"trailing ",
    b" leading",
    b"\xff\xfe",
    b"caf\xe9",
    b"\x80x",
    b"ends-with-\xc3",
    b"quote\"'",
    b"..dots",
    b"emoji \xf0\x9f\x98\x80",
    // Users' names that look like temporaries (only the reserved pattern is ferry's).
    b".ferry-tmp.1",
    b".ferry-tmp.part.00aa00aa00aa00aa",
    b".ferry-tmp-x.~ferry~",
];

const LINK_TARGETS: &[&[u8]] = &[
    b"a",
    b"../x",
    b"nonexistent/zzz",
    b"/nonexistent-ferry-test/abs",
    b"\xff\xfe",
    b".",
    b"..",
    b"with space/and more",
    b"-dash",
];

const FILE_MODES: &[u32] = &[
    0o644, 0o600, 0o640, 0o755, 0o444, 0o700, 0o400, 0o664, 0o750,
];
const DIR_MODES: &[u32] = &[0o755, 0o700, 0o750, 0o775, 0o711, 0o555];

fn name() -> impl Strategy<Value = Name> {
    prop_oneof![
        8 => "[a-z]{1,6}".prop_map(|s| Name(s.into_bytes())),
        3 => prop::sample::select(ODD_NAMES).prop_map(|s| Name(s.to_vec())),
        1 => "[a-z0-9_]{240,255}".prop_map(|s| Name(s.into_bytes())),
    ]
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => Just(0usize),
        3 => Just(1usize),
        6 => 2usize..300,
        2 => Just(4096usize),
        1 => Just(65_536usize),
        1 => Just((1usize << 20) + 17),
    ]
}

fn mtime() -> impl Strategy<Value = Mtime> {
    (1_000_000_000i64..1_900_000_000, 0u32..1_000_000_000)
}

fn owner() -> BoxedStrategy<Option<(u32, u32)>> {
    if is_root() {
        prop::option::weighted(0.25, (1000u32..1004, 1000u32..1004)).boxed()
    } else {
        Just(None).boxed()
    }
}

fn meta(modes: &'static [u32]) -> impl Strategy<Value = Meta> {
    (prop::sample::select(modes), mtime(), owner()).prop_map(|(mode, mtime, owner)| Meta {
        mode,
        mtime,
        owner,
    })
}

fn link_target() -> impl Strategy<Value = Name> {
    prop_oneof![
        3 => prop::sample::select(LINK_TARGETS).prop_map(|s| Name(s.to_vec())),
        1 => "[a-z./]{1,20}".prop_map(|s| Name(s.into_bytes())),
    ]
}

fn leaf() -> impl Strategy<Value = Spec> {
    prop_oneof![
        4 => (size(), any::<u64>(), meta(FILE_MODES)).prop_map(|(size, seed, meta)| Spec::File { size, seed, meta }),
        1 => (link_target(), meta(&[0o777])).prop_map(|(target, meta)| Spec::Link { target, meta }),
    ]
}

fn tree() -> impl Strategy<Value = Spec> {
    let sub = leaf().prop_recursive(3, 48, 6, |inner| {
        (
            prop::collection::btree_map(name(), inner, 0..6),
            meta(DIR_MODES),
        )
            .prop_map(|(kids, meta)| Spec::Dir { kids, meta })
    });
    (
        prop::collection::btree_map(name(), sub, 0..10),
        meta(DIR_MODES),
    )
        .prop_map(|(kids, meta)| Spec::Dir { kids, meta })
}

// ------------------------------------------------------------------------------------------
// Edits
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Edit {
    /// New content (same size or a new size) and a new mtime.
    Rewrite {
        same_size: bool,
        size: usize,
        seed: u64,
        mtime: Mtime,
    },
    /// Only the mtime changes.
    Touch {
        mtime: Mtime,
    },
    /// Only the permission bits change.
    Chmod {
        file_mode: u32,
        dir_mode: u32,
    },
    Delete,
    AddFile {
        name: Name,
        size: usize,
        seed: u64,
        meta: Meta,
    },
    AddDir {
        name: Name,
    },
    ToDir {
        seed: u64,
    },
    ToFile {
        size: usize,
        seed: u64,
        mtime: Mtime,
    },
    ToLink {
        target: Name,
    },
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
        (
            prop::sample::select(FILE_MODES),
            prop::sample::select(DIR_MODES)
        )
            .prop_map(|(file_mode, dir_mode)| Edit::Chmod {
                file_mode,
                dir_mode
            }),
        Just(Edit::Delete),
        (name(), size(), any::<u64>(), meta(FILE_MODES)).prop_map(|(name, size, seed, meta)| {
            Edit::AddFile {
                name,
                size,
                seed,
                meta,
            }
        }),
        name().prop_map(|name| Edit::AddDir { name }),
        any::<u64>().prop_map(|seed| Edit::ToDir { seed }),
        (size(), any::<u64>(), mtime()).prop_map(|(size, seed, mtime)| Edit::ToFile {
            size,
            seed,
            mtime
        }),
        link_target().prop_map(|target| Edit::ToLink { target }),
    ]
}

fn remove_any(p: &Path) {
    let md = fs::symlink_metadata(p).unwrap();
    if md.is_dir() {
        fs::remove_dir_all(p).unwrap();
    } else {
        fs::remove_file(p).unwrap();
    }
}

/// Apply `edits` to the tree at `root`; each picks its target among the current entries.
fn apply_edits(root: &Path, edits: &[(Index, Edit)]) {
    for (idx, e) in edits {
        let entries = walk(root);
        match e {
            Edit::AddFile {
                name,
                size,
                seed,
                meta,
            } => {
                let mut dirs = vec![PathBuf::new()];
                dirs.extend(
                    entries
                        .iter()
                        .filter(|p| fs::symlink_metadata(root.join(p)).unwrap().is_dir())
                        .cloned(),
                );
                let p = root.join(&dirs[idx.index(dirs.len())]).join(name.os());
                if fs::symlink_metadata(&p).is_err() {
                    materialize(
                        &p,
                        &Node::File {
                            data: gen_bytes(*size, *seed),
                            meta: meta.clone(),
                        },
                    );
                }
            }
            Edit::AddDir { name } => {
                let mut dirs = vec![PathBuf::new()];
                dirs.extend(
                    entries
                        .iter()
                        .filter(|p| fs::symlink_metadata(root.join(p)).unwrap().is_dir())
                        .cloned(),
                );
                let p = root.join(&dirs[idx.index(dirs.len())]).join(name.os());
                if fs::symlink_metadata(&p).is_err() {
                    fs::create_dir(&p).unwrap();
                }
            }
            _ => {
                if entries.is_empty() {
                    continue;
                }
                let p = root.join(&entries[idx.index(entries.len())]);
                let md = fs::symlink_metadata(&p).unwrap();
                let old_mtime = (md.mtime(), md.mtime_nsec() as u32);
                match e {
                    Edit::Rewrite {
                        same_size,
                        size,
                        seed,
                        mtime,
                    } => {
                        if !md.is_file() {
                            continue;
                        }
                        let data = if *same_size {
                            let mut d = gen_bytes(md.len() as usize, *seed);
                            if d == fs::read(&p).unwrap() && !d.is_empty() {
                                d[0] ^= 1;
                            }
                            d
                        } else {
                            gen_bytes(*size, *seed)
                        };
                        rewrite_keep_meta(&p, &data);
                        set_mtime(&p, differ(*mtime, old_mtime));
                    }
                    Edit::Touch { mtime } => set_mtime(&p, differ(*mtime, old_mtime)),
                    Edit::Chmod {
                        file_mode,
                        dir_mode,
                    } => {
                        if md.is_file() {
                            chmod(&p, *file_mode);
                        } else if md.is_dir() {
                            chmod(&p, *dir_mode);
                        }
                    }
                    Edit::Delete => remove_any(&p),
                    Edit::ToDir { seed } => {
                        remove_any(&p);
                        fs::create_dir(&p).unwrap();
                        fs::write(p.join("inner"), gen_bytes((*seed % 100) as usize, *seed))
                            .unwrap();
                    }
                    Edit::ToFile { size, seed, mtime } => {
                        remove_any(&p);
                        fs::write(&p, gen_bytes(*size, *seed)).unwrap();
                        set_mtime(&p, *mtime);
                    }
                    Edit::ToLink { target } => {
                        remove_any(&p);
                        symlink(Path::new(target.os()), &p).unwrap();
                    }
                    Edit::AddFile { .. } | Edit::AddDir { .. } => unreachable!(),
                }
            }
        }
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 32,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn jobs_flags(j: u8) -> Vec<&'static str> {
    match j % 4 {
        0 => vec![],
        1 => vec!["-j", "1"],
        2 => vec!["-j", "2"],
        _ => vec!["--jobs", "8"],
    }
}

// ------------------------------------------------------------------------------------------
// Properties
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// copy and sync into an empty target reproduce SRC; after random edits of SRC a sync
    /// reproduces it again; a further sync does nothing. SRC is never touched.
    #[test]
    fn sync_reproduces_src_after_edits(
        spec in tree(),
        edits in prop::collection::vec((any::<Index>(), edit()), 1..10),
        j in any::<u8>(),
    ) {
        let t = tmpdir();
        let src = t.path().join("src");
        materialize(&src, &to_node(&spec));
        let flags = jobs_flags(j);

        let copy_dst = t.path().join("copy");
        run_on("copy", &src, &copy_dst, &flags).ok();
        assert_trees_equal(&src, &copy_dst);

        let dst = t.path().join("dst");
        run_on("sync", &src, &dst, &flags).ok();
        assert_trees_equal(&src, &dst);

        apply_edits(&src, &edits);
        let mut f = flags.clone();
        f.push("--json");
        if fs::read_dir(&src).unwrap().next().is_none() && fs::read_dir(&dst).unwrap().next().is_some() {
            // Everything deleted: an empty SRC is refused until --force.
            let before = snapshot(&dst);
            run_on("sync", &src, &dst, &f).code_is(2);
            assert_untouched(&before, &snapshot(&dst));
            f.push("--force");
        }
        let r = run_on("sync", &src, &dst, &f);
        r.ok();
        prop_assert_eq!(summary(&r).errors, 0);
        assert_trees_equal(&src, &dst);

        let before = snapshot(&dst);
        let r = run_on("sync", &src, &dst, &f);
        r.ok();
        let s = summary(&r);
        prop_assert_eq!(
            (s.files_copied, s.bytes_copied, s.files_deleted, s.dirs_created, s.errors),
            (0, 0, 0, 0, 0),
            "third run did work\n{}", r
        );
        assert_same_content(&before, &snapshot(&dst));
        assert_trees_equal(&src, &dst);
    }

    /// copy into a target with extra entries: everything in SRC is present and equal, extra
    /// entries stay exactly as they were.
    #[test]
    fn copy_keeps_extras(src_spec in tree(), dst_spec in tree(), j in any::<u8>()) {
        let t = tmpdir();
        let src = t.path().join("src");
        let dst = t.path().join("dst");
        materialize(&src, &to_node(&src_spec));
        let mut dst_spec = dst_spec;
        if let (Spec::Dir { kids: sk, .. }, Spec::Dir { kids: dk, .. }) = (&src_spec, &mut dst_spec) {
            prune(sk, dk);
        }
        materialize(&dst, &to_node(&dst_spec));
        let src_snap = snapshot(&src);
        let before = snapshot(&dst);

        let flags = jobs_flags(j);
        run_on("copy", &src, &dst, &flags).ok();
        assert_tree_contains(&dst, &src);
        let after = snapshot(&dst);
        for (k, e) in &before {
            if src_snap.contains_key(k) {
                continue;
            }
            let a = after.get(k);
            prop_assert!(a.is_some(), "copy deleted {:?}", k);
            let mut a = a.unwrap().clone();
            a.ino = e.ino;
            a.ctime_ns = e.ctime_ns;
            prop_assert_eq!(&a, e, "copy changed extra entry {:?}", k);
        }

        let mut f = flags.clone();
        f.push("--json");
        let r = run_on("copy", &src, &dst, &f);
        r.ok();
        let s = summary(&r);
        prop_assert_eq!((s.files_copied, s.files_deleted, s.errors), (0, 0, 0), "second copy did work\n{}", r);
        assert_tree_contains(&dst, &src);
    }

    /// Same size and mtime but different content: recopied only with --checksum.
    #[test]
    fn checksum_catches_same_size_same_mtime(
        spec in tree(),
        picks in prop::collection::vec(any::<Index>(), 1..4),
        seed in any::<u64>(),
    ) {
        let t = tmpdir();
        let src = t.path().join("src");
        let dst = t.path().join("dst");
        materialize(&src, &to_node(&spec));
        run_on("sync", &src, &dst, &[]).ok();
        assert_trees_equal(&src, &dst);

        let files: Vec<PathBuf> = walk(&src)
            .into_iter()
            .filter(|p| {
                let md = fs::symlink_metadata(src.join(p)).unwrap();
                md.is_file() && md.len() > 0
            })
            .collect();
        let mut chosen: Vec<PathBuf> = Vec::new();
        if !files.is_empty() {
            for i in &picks {
                let p = files[i.index(files.len())].clone();
                if !chosen.contains(&p) {
                    chosen.push(p);
                }
            }
        }
        let mut rng = crate::util::Rng::new(seed);
        let mut old: BTreeMap<PathBuf, Vec<u8>> = BTreeMap::new();
        for p in &chosen {
            let mut data = fs::read(src.join(p)).unwrap();
            old.insert(p.clone(), data.clone());
            let pos = rng.range(0, data.len() as u64) as usize;
            data[pos] ^= 0xA5;
            rewrite_keep_meta(&src.join(p), &data);
        }

        let r = run_on("sync", &src, &dst, &["--json"]);
        r.ok();
        prop_assert_eq!(summary(&r).files_copied, 0, "without --checksum nothing is recopied\n{}", r);
        for (p, data) in &old {
            prop_assert!(&fs::read(dst.join(p)).unwrap() == data, "{:?} was recopied without --checksum", p);
        }

        let r = run_on("sync", &src, &dst, &["--checksum", "--json"]);
        r.ok();
        prop_assert_eq!(summary(&r).files_copied, chosen.len() as u64, "{}", r);
        assert_trees_equal(&src, &dst);

        let r = run_on("sync", &src, &dst, &["-c", "--json"]);
        r.ok();
        prop_assert_eq!(summary(&r).files_copied, 0, "{}", r);
    }
}

proptest! {
    #![proptest_config(config())]

    /// `sync --max-delete`: refused (exit 2, DST untouched) exactly when the run would
    /// remove more than the limit (what `-n` counts, every entry of a removed tree
    /// included); otherwise it removes that many and reproduces SRC. An empty SRC root
    /// against a DST with entries is refused unless --force.
    #[test]
    fn max_delete_and_empty_src_refuse_exactly_when_they_should(
        src_spec in tree(),
        dst_spec in tree(),
        limit in 0u64..40,
        percent in any::<bool>(),
        force in any::<bool>(),
        j in any::<u8>(),
    ) {
        let t = tmpdir();
        let src = t.path().join("src");
        let dst = t.path().join("dst");
        materialize(&src, &to_node(&src_spec));
        materialize(&dst, &to_node(&dst_spec));
        let mut flags = jobs_flags(j);
        flags.push("--json");
        if force {
            flags.push("--force");
        }
        let empty_refusal = !force
            && fs::read_dir(&src).unwrap().next().is_none()
            && fs::read_dir(&dst).unwrap().next().is_some();

        let r = run_on("sync", &src, &dst, &[&flags[..], &["-n"]].concat());
        if empty_refusal {
            r.code_is(2);
        } else {
            r.ok();
        }
        let would = if empty_refusal { 0 } else { summary(&r).files_deleted };
        let entries = walk(&dst).len() as u64;
        let (arg, allowed) = if percent {
            let p = limit.min(100) * 5 / 2;
            (format!("{p}%"), entries * p / 100)
        } else {
            (limit.to_string(), limit)
        };
        let before = snapshot(&dst);
        let r = run_on("sync", &src, &dst, &[&flags[..], &["--max-delete", &arg]].concat());
        if empty_refusal || would > allowed {
            r.code_is(2);
            prop_assert!(
                empty_refusal || r.err().contains(&format!("refusing to delete {would}")),
                "{}", r
            );
            assert_untouched(&before, &snapshot(&dst));
        } else {
            r.ok();
            let s = summary(&r);
            prop_assert_eq!(s.files_deleted, would, "{}", r);
            prop_assert_eq!(s.errors, 0);
            assert_trees_equal(&src, &dst);
        }
    }
}

/// Drop DST entries whose kind conflicts with SRC (dir vs non-dir): the contract leaves copy's
/// behaviour there open. File/symlink vs file/symlink stays (copy replaces those).
fn prune(src: &BTreeMap<Name, Spec>, dst: &mut BTreeMap<Name, Spec>) {
    dst.retain(|name, d| match (src.get(name), d) {
        (None, _) => true,
        (Some(Spec::Dir { kids: sk, .. }), Spec::Dir { kids: dk, .. }) => {
            prune(sk, dk);
            true
        }
        (Some(Spec::Dir { .. }), _) | (Some(_), Spec::Dir { .. }) => false,
        (Some(_), _) => true,
    });
}
