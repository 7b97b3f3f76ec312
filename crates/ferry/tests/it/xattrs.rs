//! Extended attributes (`-X`) and POSIX ACLs (`-A`): random trees with random attributes
//! (binary values, NULs, many per entry) and random access and default ACLs; copy, sync and
//! bisync make DST's attributes equal to SRC's, read back with the xattr syscalls (ACLs as
//! the kernel's raw values, entry for entry), also after attribute-only edits (bytes
//! untouched, files not rewritten), as root and as an unprivileged user.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::*;
use proptest::prelude::*;
use proptest::sample::Index;
use rustix::fs::XattrFlags;

/// An entry's attributes: name → value.
type Attrs = BTreeMap<Vec<u8>, Vec<u8>>;

const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Every attribute of `p` (a symlink itself, not its target), read with the syscalls.
fn attrs(p: &Path) -> Attrs {
    let c = cpath(p);
    let mut names = vec![0u8; 65536];
    let n = rustix::fs::llistxattr(c.as_c_str(), &mut names[..])
        .unwrap_or_else(|e| panic!("listxattr {}: {e}", p.display()));
    let mut out = Attrs::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        let len = rustix::fs::lgetxattr(c.as_c_str(), cn.as_c_str(), &mut v[..])
            .unwrap_or_else(|e| panic!("getxattr {} {:?}: {e}", p.display(), cn));
        out.insert(name.to_vec(), v[..len].to_vec());
    }
    out
}

fn set_attr(p: &Path, name: &[u8], value: &[u8]) -> rustix::io::Result<()> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    rustix::fs::lsetxattr(c.as_c_str(), n.as_c_str(), value, XattrFlags::empty())
}

fn remove_attr(p: &Path, name: &[u8]) {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    match rustix::fs::lremovexattr(c.as_c_str(), n.as_c_str()) {
        Ok(()) | Err(rustix::io::Errno::NODATA) => {}
        Err(e) => panic!("removexattr {} {:?}: {e}", p.display(), n),
    }
}

/// Attribute differences between the trees (every entry, the roots included).
fn attr_diffs(src: &Path, dst: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut paths = vec![PathBuf::new()];
    paths.extend(walk(src));
    for rel in paths {
        let (a, b) = (attrs(&join(src, &rel)), attrs(&join(dst, &rel)));
        if a != b {
            out.push(format!("{rel:?}: SRC {}, DST {}", show(&a), show(&b)));
        }
    }
    out
}

fn show(a: &Attrs) -> String {
    let v: Vec<String> = a
        .iter()
        .map(|(n, v)| format!("{}={}B", n.escape_ascii(), v.len()))
        .collect();
    format!("[{}]", v.join(" "))
}

#[track_caller]
fn assert_attrs_equal(src: &Path, dst: &Path) {
    let d = attr_diffs(src, dst);
    assert!(d.is_empty(), "attributes differ:\n  {}", d.join("\n  "));
}

/// No entry of `root` has an attribute.
#[track_caller]
fn assert_no_attrs(root: &Path) {
    let mut paths = vec![PathBuf::new()];
    paths.extend(walk(root));
    for rel in paths {
        let a = attrs(&join(root, &rel));
        assert!(a.is_empty(), "{rel:?} has {}", show(&a));
    }
}

// ------------------------------------------------------------------------------------------
// ACLs, as the kernel's raw xattr value (version 2; entries of tag, permissions, id)
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Acl {
    user: u16,
    group: u16,
    other: u16,
    mask: u16,
    users: Vec<(u32, u16)>,
    groups: Vec<(u32, u16)>,
}

impl Acl {
    fn raw(&self) -> Vec<u8> {
        const UNDEF: u32 = u32::MAX;
        let mut e: Vec<(u16, u16, u32)> = vec![(0x01, self.user, UNDEF)];
        let mut users = self.users.clone();
        users.sort();
        users.dedup_by_key(|u| u.0);
        e.extend(users.iter().map(|&(id, p)| (0x02, p, id)));
        e.push((0x04, self.group, UNDEF));
        let mut groups = self.groups.clone();
        groups.sort();
        groups.dedup_by_key(|g| g.0);
        e.extend(groups.iter().map(|&(id, p)| (0x08, p, id)));
        if !users.is_empty() || !groups.is_empty() {
            e.push((0x10, self.mask, UNDEF));
        }
        e.push((0x20, self.other, UNDEF));
        let mut out = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in e {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&perm.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }
}

/// A random ACL; `owner`: permissions the owner entry always has (an unprivileged owner
/// must still read and enter its tree).
fn acl(owner: u16) -> impl Strategy<Value = Acl> {
    let perm = || 0u16..8;
    let named = || prop::collection::vec((1000u32..1008, 0u16..8), 0..4);
    (perm(), perm(), perm(), perm(), named(), named()).prop_map(
        move |(user, group, other, mask, users, groups)| Acl {
            user: user | owner,
            group,
            other,
            mask,
            users,
            groups,
        },
    )
}

/// Root may deny itself nothing; an unprivileged owner keeps rwx.
fn owner_perms(root: bool) -> u16 {
    if root {
        0
    } else {
        7
    }
}

// ------------------------------------------------------------------------------------------
// Random trees with attributes
// ------------------------------------------------------------------------------------------

/// Attributes of one entry: extended attributes (user.*, and trusted.* as root) and ACLs.
#[derive(Clone, Debug, Default)]
struct Extra {
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    trusted: Vec<(Vec<u8>, Vec<u8>)>,
    access: Option<Acl>,
    default: Option<Acl>,
}

#[derive(Clone, Debug)]
enum Spec {
    File {
        size: usize,
        seed: u64,
        mode: u32,
        extra: Extra,
    },
    Link {
        target: String,
        extra: Extra,
    },
    Dir {
        kids: BTreeMap<String, Spec>,
        mode: u32,
        extra: Extra,
    },
}

fn attr_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => "[a-z0-9_.-]{1,24}".prop_map(|s| s.into_bytes()),
        1 => prop::collection::vec(1u8..=255, 1..12),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..40),
        2 => prop::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..200),
        1 => prop::collection::vec(any::<u8>(), 1000..2600),
    ]
}

/// Up to dozens of attributes, trimmed to what one ext4 block holds (about 4 KiB per inode
/// for all attributes together); bigger values are tested on tmpfs (`large_values_on_tmpfs`).
fn xattr_list(prefix: &'static [u8]) -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    prop::collection::vec((attr_name(), value()), 0..30).prop_map(move |v| {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        let mut total = 0;
        for (n, val) in v {
            let mut name = prefix.to_vec();
            name.extend_from_slice(&n);
            let cost = name.len() + val.len() + 24;
            if total + cost > 2800 || !seen.insert(name.clone()) {
                continue;
            }
            total += cost;
            out.push((name, val));
        }
        out
    })
}

fn extra(trusted: bool) -> impl Strategy<Value = Extra> {
    (
        xattr_list(b"user."),
        if trusted {
            prop::collection::vec(
                ("[a-z]{1,8}", prop::collection::vec(any::<u8>(), 0..30)),
                0..3,
            )
            .prop_map(|v| {
                v.into_iter()
                    .map(|(n, val)| (format!("trusted.{n}").into_bytes(), val))
                    .collect()
            })
            .boxed()
        } else {
            Just(Vec::new()).boxed()
        },
        prop::option::weighted(0.4, acl(owner_perms(trusted))),
        prop::option::weighted(0.4, acl(owner_perms(trusted))),
    )
        .prop_map(|(xattrs, trusted, access, default)| Extra {
            xattrs,
            trusted,
            access,
            default,
        })
}

const MODES: &[u32] = &[0o644, 0o600, 0o640, 0o755, 0o664, 0o700, 0o750];
const DIR_MODES: &[u32] = &[0o755, 0o700, 0o750, 0o775, 0o711];

fn tree(trusted: bool) -> impl Strategy<Value = Spec> {
    let leaf = prop_oneof![
        4 => (0usize..3000, any::<u64>(), prop::sample::select(MODES), extra(trusted))
            .prop_map(|(size, seed, mode, extra)| Spec::File { size, seed, mode, extra }),
        1 => ("[a-z]{1,5}", extra(trusted)).prop_map(|(target, extra)| Spec::Link { target, extra }),
    ];
    let sub = leaf.prop_recursive(3, 24, 5, move |inner| {
        (
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..5),
            prop::sample::select(DIR_MODES),
            extra(trusted),
        )
            .prop_map(|(kids, mode, extra)| Spec::Dir { kids, mode, extra })
    });
    (
        prop::collection::btree_map("[a-z]{1,6}", sub, 0..8),
        extra(trusted),
    )
        .prop_map(|(kids, extra)| Spec::Dir {
            kids,
            mode: 0o755,
            extra,
        })
}

fn give(p: &Path, e: &Extra, is_dir: bool, is_link: bool) {
    if !is_link {
        for (n, v) in &e.xattrs {
            set_attr(p, n, v).unwrap_or_else(|err| panic!("set {:?} on {}: {err}", n, p.display()));
        }
        if let Some(a) = &e.access {
            set_attr(p, ACCESS, &a.raw()).unwrap();
        }
        if let (true, Some(a)) = (is_dir, &e.default) {
            set_attr(p, DEFAULT, &a.raw()).unwrap();
        }
    }
    for (n, v) in &e.trusted {
        set_attr(p, n, v).unwrap();
    }
}

/// Create `spec` at `p`; attributes are set after a directory's content, the mtime last.
fn make(p: &Path, spec: &Spec) {
    match spec {
        Spec::File {
            size,
            seed,
            mode,
            extra,
        } => {
            fs::write(p, gen_bytes(*size, *seed)).unwrap();
            chmod(p, *mode);
            give(p, extra, false, false);
            set_mtime(
                p,
                (
                    1_600_000_000 + *seed as i64 % 1000,
                    (*seed % 1_000_000_000) as u32,
                ),
            );
        }
        Spec::Link { target, extra } => {
            symlink(target, p).unwrap();
            give(p, extra, false, true);
        }
        Spec::Dir { kids, mode, extra } => {
            if !p.is_dir() {
                fs::create_dir(p).unwrap();
            }
            for (n, k) in kids {
                make(&p.join(n), k);
            }
            chmod(p, *mode);
            give(p, extra, true, false);
            set_mtime(p, (1_650_000_000, 7));
        }
    }
}

/// An attribute-only edit of one entry: the bytes and mtime stay.
#[derive(Clone, Debug)]
enum Edit {
    Add(Vec<u8>, Vec<u8>),
    Change(Index, Vec<u8>),
    Remove(Index),
    SetAcl(Acl),
    DropAcl,
    SetDefault(Acl),
    DropDefault,
}

fn edit(root: bool) -> impl Strategy<Value = Edit> {
    prop_oneof![
        (attr_name(), prop::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(n, v)| Edit::Add([&b"user."[..], &n].concat(), v)),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(i, v)| Edit::Change(i, v)),
        any::<Index>().prop_map(Edit::Remove),
        acl(owner_perms(root)).prop_map(Edit::SetAcl),
        Just(Edit::DropAcl),
        acl(owner_perms(root)).prop_map(Edit::SetDefault),
        Just(Edit::DropDefault),
    ]
}

/// Apply `edits` to entries of `root` (the root included); returns the paths touched.
fn apply(root: &Path, edits: &[(Index, Edit)]) {
    let mut paths = vec![PathBuf::new()];
    paths.extend(walk(root));
    for (which, e) in edits {
        let p = join(root, &paths[which.index(paths.len())]);
        let md = fs::symlink_metadata(&p).unwrap();
        if md.file_type().is_symlink() {
            continue;
        }
        let user: Vec<Vec<u8>> = attrs(&p)
            .into_keys()
            .filter(|n| n.starts_with(b"user."))
            .collect();
        let size: usize = attrs(&p).iter().map(|(n, v)| n.len() + v.len() + 24).sum();
        match e {
            Edit::Add(n, v) if size + n.len() + v.len() < 3000 => set_attr(&p, n, v).unwrap(),
            Edit::Change(i, v) if !user.is_empty() && size + v.len() < 3000 => {
                set_attr(&p, &user[i.index(user.len())], v).unwrap()
            }
            Edit::Remove(i) if !user.is_empty() => remove_attr(&p, &user[i.index(user.len())]),
            Edit::SetAcl(a) => set_attr(&p, ACCESS, &a.raw()).unwrap(),
            Edit::DropAcl => {
                remove_attr(&p, ACCESS);
            }
            Edit::SetDefault(a) if md.is_dir() => set_attr(&p, DEFAULT, &a.raw()).unwrap(),
            Edit::DropDefault if md.is_dir() => remove_attr(&p, DEFAULT),
            _ => {}
        }
    }
}

/// Inode of every regular file: a file rewritten gets a new one.
fn inodes(root: &Path) -> BTreeMap<PathBuf, u64> {
    walk(root)
        .into_iter()
        .filter_map(|p| {
            let md = fs::symlink_metadata(root.join(&p)).unwrap();
            md.is_file().then(|| (p, md.ino()))
        })
        .collect()
}

fn records(r: &Run, kind: &str) -> usize {
    json_lines(r).iter().filter(|j| j["type"] == kind).count()
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_shrink_iters: 100,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// `ferry ARGS` as the unprivileged user 65534 (nobody).
fn ferry_as_nobody(args: &[&OsStr]) -> Run {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin())
        .args(args);
    run_within(c, std::time::Duration::from_secs(300))
}

/// Hand the tree at `root` (and `root`) to user 65534.
fn chown_nobody(root: &Path) {
    let mut paths = vec![PathBuf::new()];
    paths.extend(walk(root));
    for p in paths {
        rustix::fs::chownat(
            rustix::fs::CWD,
            join(root, &p),
            Some(rustix::fs::Uid::from_raw(65534)),
            Some(rustix::fs::Gid::from_raw(65534)),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// copy and sync with -X -A make every entry's attributes and ACLs equal to SRC's; a
    /// sync without them copies none; attribute-only edits of SRC (added, changed, removed
    /// attributes, access and default ACLs set or dropped) are carried by the next sync
    /// without rewriting any file; the run after that changes nothing.
    #[test]
    fn attributes_and_acls_are_copied_and_converge(
        spec in tree(is_root()),
        edits in prop::collection::vec((any::<Index>(), edit(is_root())), 1..12),
    ) {
        let t = tmpdir();
        let src = t.path().join("src");
        make(&src, &spec);

        let copy = t.path().join("copy");
        let r = run_on("copy", &src, &copy, &["-X", "-A", "--json"]);
        r.ok();
        prop_assert_eq!(summary(&r).errors, 0, "{}", r);
        assert_trees_equal(&src, &copy);
        assert_attrs_equal(&src, &copy);

        let plain = t.path().join("plain");
        run_on("sync", &src, &plain, &[]).ok();
        assert_trees_equal(&src, &plain);
        assert_no_attrs(&plain);

        let dst = t.path().join("dst");
        run_on("sync", &src, &dst, &["--xattrs", "--acls"]).ok();
        assert_trees_equal(&src, &dst);
        assert_attrs_equal(&src, &dst);

        apply(&src, &edits);
        let before = inodes(&dst);
        let r = run_on("sync", &src, &dst, &["-XA", "--json"]);
        r.ok();
        let s = summary(&r);
        prop_assert_eq!((s.files_copied, s.errors), (0, 0), "{}", r);
        prop_assert_eq!(inodes(&dst), before, "a file was rewritten");
        assert_trees_equal(&src, &dst);
        assert_attrs_equal(&src, &dst);

        let r = run_on("sync", &src, &dst, &["-X", "-A", "--json"]);
        r.ok();
        prop_assert_eq!(records(&r, "meta"), 0, "nothing left to do\n{}", r);
    }
}

proptest! {
    #![proptest_config(config(6))]

    /// The same as an unprivileged user (user.* attributes and ACLs, which an owner may
    /// set), ferry run under setpriv on trees that user owns.
    #[test]
    fn unprivileged_user_keeps_attributes_and_acls(
        spec in tree(false),
        edits in prop::collection::vec((any::<Index>(), edit(false)), 1..8),
    ) {
        if !is_root() {
            // Unprivileged already: the property above is this one.
            return Ok(());
        }
        let t = tmpdir();
        let src = t.path().join("src");
        make(&src, &spec);
        chown_nobody(t.path());
        let dst = t.path().join("dst");
        let sync = |extra: &[&str]| {
            let mut a: Vec<&OsStr> = vec![OsStr::new("sync"), OsStr::new("-X"), OsStr::new("-A")];
            a.extend(extra.iter().map(OsStr::new));
            a.push(src.as_os_str());
            a.push(dst.as_os_str());
            ferry_as_nobody(&a)
        };
        sync(&[]).ok();
        assert_trees_equal(&src, &dst);
        assert_attrs_equal(&src, &dst);
        prop_assert_eq!(fs::metadata(&dst).unwrap().uid(), 65534);

        apply(&src, &edits);
        let before = inodes(&dst);
        let r = sync(&["--json"]);
        r.ok();
        prop_assert_eq!(summary(&r).files_copied, 0, "{}", r);
        prop_assert_eq!(inodes(&dst), before);
        assert_attrs_equal(&src, &dst);
    }
}

/// Many attributes with values up to the kernel's 64 KiB, on tmpfs (ext4 keeps about 4 KiB
/// per inode): copied exactly. Skipped where /dev/shm keeps no user attributes.
#[test]
fn large_values_on_tmpfs() {
    let Ok(t) = tempfile::Builder::new()
        .prefix("ferry-xattr-")
        .tempdir_in("/dev/shm")
    else {
        return;
    };
    let src = t.path().join("src");
    let f = write(&src, "f", b"data");
    if set_attr(&f, b"user.probe", b"1").is_err() {
        eprintln!("skipped: tmpfs here keeps no user attributes");
        return;
    }
    for i in 0..40u32 {
        let len = [0, 1, 100, 4096, 8192, 30_000][i as usize % 6];
        let v: Vec<u8> = (0..len).map(|k| (k as u32 * 7 + i) as u8).collect();
        set_attr(&f, format!("user.a{i}").as_bytes(), &v).unwrap();
    }
    set_attr(&f, b"user.max", &gen_bytes(65536, 9)).unwrap();
    let dst = t.path().join("dst");
    run_on("copy", &src, &dst, &["-X"]).ok();
    assert_attrs_equal(&src, &dst);
    assert_eq!(attrs(&dst.join("f")).len(), 42);
}

/// As root: trusted.* on a symlink, and a file capability on a file owned by someone else
/// (a chown drops a capability, so it must be set after the owner).
#[test]
fn root_keeps_trusted_on_symlinks_and_capabilities_after_chown() {
    if !is_root() {
        return;
    }
    let t = tmpdir();
    let src = t.path().join("src");
    let f = write(&src, "tool", b"#!/bin/sh\n");
    rustix::fs::chownat(
        rustix::fs::CWD,
        &f,
        Some(rustix::fs::Uid::from_raw(1001)),
        Some(rustix::fs::Gid::from_raw(1002)),
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
    // VFS_CAP_REVISION_2 | effective; cap_net_raw (13) permitted.
    let mut cap = 0x0200_0001u32.to_le_bytes().to_vec();
    for w in [1u32 << 13, 0, 0, 0] {
        cap.extend_from_slice(&w.to_le_bytes());
    }
    set_attr(&f, b"security.capability", &cap).unwrap();
    set_attr(&f, b"trusted.t", b"x\0y").unwrap();
    let l = ln(&src, "link", "tool");
    set_attr(&l, b"trusted.on-link", b"\x00\x01").unwrap();
    let dst = t.path().join("dst");
    run_on("copy", &src, &dst, &["-X"]).ok();
    assert_trees_equal(&src, &dst);
    assert_attrs_equal(&src, &dst);
    assert!(attrs(&dst.join("tool")).contains_key(&b"security.capability"[..]));
}

/// A DST filesystem that keeps no attributes (ramfs): the files are copied, one note says
/// so, no error per file, exit 0.
#[test]
fn destination_without_xattr_support_is_one_note() {
    if !is_root() {
        return;
    }
    let t = tmpdir();
    let src = t.path().join("src");
    for i in 0..5 {
        let f = write(&src, format!("d/f{i}"), b"x");
        set_attr(&f, b"user.a", b"1").unwrap();
        set_attr(
            &f,
            ACCESS,
            &Acl {
                user: 6,
                group: 4,
                other: 0,
                mask: 6,
                users: vec![(1000, 6)],
                groups: vec![],
            }
            .raw(),
        )
        .unwrap();
    }
    let dst = t.path().join("ram");
    fs::create_dir(&dst).unwrap();
    let script = format!(
        "mount -t ramfs none '{0}' && exec '{1}' copy -X -A --json '{2}' '{0}/out'",
        dst.display(),
        Path::new(&bin()).display(),
        src.display()
    );
    let mut c = Command::new("unshare");
    c.args(["-m", "sh", "-c", &script]);
    let r = run_within(c, std::time::Duration::from_secs(60));
    if r.err().contains("mount") && r.code != Some(0) {
        eprintln!("skipped: cannot mount ramfs here: {}", r.err());
        return;
    }
    r.ok();
    let s = summary(&r);
    assert_eq!((s.files_copied, s.errors), (5, 0), "{r}");
    assert_eq!(
        r.err()
            .matches("does not support extended attributes")
            .count(),
        1,
        "{r}"
    );
    assert!(r.err().contains("5 entries left without"), "{r}");
}

/// A DST directory with a default ACL hands an ACL down to what is created in it: with -A
/// new files and directories still end up with SRC's ACL (or none) and SRC's mode, on the
/// first run (a DST root that had a default ACL) and on later runs (one copied from SRC).
#[test]
fn inherited_acls_are_replaced_by_the_source_ones() {
    let t = tmpdir();
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    let dflt = Acl {
        user: 7,
        group: 7,
        other: 7,
        mask: 7,
        users: vec![(1003, 7)],
        groups: vec![],
    };
    write(&src, "plain", b"a");
    chmod(&src.join("plain"), 0o640);
    let sub = mkdirs(&src, "sub");
    set_attr(&sub, DEFAULT, &dflt.raw()).unwrap();
    fs::create_dir(&dst).unwrap();
    set_attr(&dst, DEFAULT, &dflt.raw()).unwrap();
    run_on("sync", &src, &dst, &["-A"]).ok();
    assert_trees_equal(&src, &dst);
    assert_attrs_equal(&src, &dst);

    // New entries inside a directory whose DST copy now hands its default ACL down (in SRC
    // they inherit it too: dropped there, so SRC's have none).
    let bare = |p: &Path, mode: u32| {
        remove_attr(p, ACCESS);
        remove_attr(p, DEFAULT);
        chmod(p, mode);
    };
    bare(&write(&src, "sub/new", b"bytes"), 0o600);
    bare(&write(&src, "sub/empty", b""), 0o604);
    let own = write(&src, "sub/own", b"acl");
    set_attr(
        &own,
        ACCESS,
        &Acl {
            user: 6,
            group: 0,
            other: 0,
            mask: 4,
            users: vec![],
            groups: vec![(1005, 4)],
        }
        .raw(),
    )
    .unwrap();
    bare(&mkdirs(&src, "sub/inner"), 0o700);
    set_mtime(&src.join("sub"), (1_600_000_000, 0));
    run_on("sync", &src, &dst, &["-A"]).ok();
    assert_trees_equal(&src, &dst);
    assert_attrs_equal(&src, &dst);
}

/// `-n` reports an attribute-only change as `meta` and changes nothing.
#[test]
fn dry_run_reports_attribute_changes_and_changes_nothing() {
    let t = tmpdir();
    let src = t.path().join("src");
    let f = write(&src, "f", b"x");
    let dst = t.path().join("dst");
    run_on("sync", &src, &dst, &["-X"]).ok();
    set_attr(&f, b"user.new", b"v").unwrap();
    let r = run_on("sync", &src, &dst, &["-X", "-n"]);
    r.ok();
    assert!(r.out().contains("meta f"), "{r}");
    assert!(attrs(&dst.join("f")).is_empty());
    run_on("sync", &src, &dst, &["-X"]).ok();
    assert_attrs_equal(&src, &dst);
}

/// bisync -X -A: files and symlinks it copies, and files whose metadata it updates, carry
/// their attributes and ACLs, both ways.
#[test]
fn bisync_carries_attributes_of_what_it_copies() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let f = write(&a, "d/f", b"one");
    set_attr(&f, b"user.x", b"\0bin\0").unwrap();
    let acl = Acl {
        user: 6,
        group: 4,
        other: 4,
        mask: 6,
        users: vec![(1001, 6)],
        groups: vec![(1002, 4)],
    };
    set_attr(&f, ACCESS, &acl.raw()).unwrap();
    let j = t.path().join("j.sqlite");
    let bisync = || crate::util::s3::run(&[&"bisync", &"-X", &"-A", &"--journal", &j, &a, &b]);
    bisync().ok();
    let g = b.join("d/f");
    assert_eq!(fs::read(&g).unwrap(), b"one");
    assert_eq!(attrs(&g), attrs(&f));
    assert!(attrs(&g).contains_key(ACCESS));

    // Changed on B (new bytes and attributes): carried back to A.
    fs::write(&g, b"two!").unwrap();
    set_attr(&g, b"user.y", b"y").unwrap();
    remove_attr(&g, ACCESS);
    set_mtime(&g, (1_700_000_000, 5));
    bisync().ok();
    assert_eq!(fs::read(&f).unwrap(), b"two!");
    assert_eq!(attrs(&f), attrs(&g));
    assert!(!attrs(&f).contains_key(ACCESS));

    // Only the mtime changed on A: the metadata update carries A's attributes.
    set_attr(&f, b"user.z", b"z").unwrap();
    set_mtime(&f, (1_700_000_100, 0));
    bisync().ok();
    assert_eq!(attrs(&f), attrs(&g));
}

/// With an S3 side, -X and -A are a note, once; the files are copied.
#[test]
fn s3_keeps_no_attributes_and_says_so_once() {
    crate::util::s3::each_server(|s3| {
        let t = tmpdir();
        let src = t.path().join("src");
        for i in 0..4 {
            let f = write(&src, format!("f{i}"), b"x");
            set_attr(&f, b"user.a", b"1").unwrap();
        }
        let url = s3.url("xattrs");
        let r = s3.run(&[&"copy", &"-X", &"-A", &"--json", &src, &url]);
        r.ok();
        assert_eq!(summary(&r).files_copied, 4, "{r}");
        let notes = r.err().matches("keeps none").count();
        assert_eq!(notes, 1, "{r}");
        assert!(r.err().contains("-X/-A"), "{r}");
        let back = t.path().join("back");
        let r = s3.run(&[&"copy", &"-X", &url, &back]);
        r.ok();
        assert_eq!(r.err().matches("keeps none").count(), 1, "{r}");
        assert_no_attrs(&back);
    });
}
