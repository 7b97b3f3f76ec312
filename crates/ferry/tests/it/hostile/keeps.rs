//! Hostile tests: keeps (see main.rs). What a run keeps before it replaces
//! or removes an entry (`-b`, `--suffix`, `--backup-dir`, `--versions`) and
//! what `ferry restore` puts back: a keep never replaces an existing entry
//! (a user's `NAME~`, an older keep, a name the source is about to create),
//! a keep on another filesystem and a restore keep every attribute and ACL
//! and every hole, and `ferry versions --json` gives names as they are.

#[allow(unused_imports)]
use crate::util::*;

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;

/// A hostile name: a leading dash, a newline, a byte that is not UTF-8.
const HOSTILE: &[u8] = b"-n\nx\xff";

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn named(root: &Path, name: &[u8]) -> PathBuf {
    root.join(os(name))
}

/// Every name of directory `d`, as bytes, sorted.
fn names(d: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_vec())
        .collect();
    v.sort();
    v
}

#[test]
fn suffix_keeps_take_a_free_name_never_a_users_file_nor_a_source_name() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    mkdirs(&src, "");
    mkdirs(&dst, "");
    let hostile_kept = [HOSTILE, b"~"].concat();
    // foo: updated; DST has a user's foo~ that SRC does not have.
    write(&src, "foo", b"foo v2 (new)");
    write(&dst, "foo", b"foo v1");
    write(&dst, "foo~", b"the user's own foo~");
    // bar: updated; SRC has a new bar~ that DST lacks: the keep of bar must
    // not take that name (the run creates it).
    write(&src, "bar", b"bar v2 (new)");
    write(&src, "bar~", b"bar~ from SRC");
    write(&dst, "bar", b"bar v1");
    // baz~: a file of SRC's, changed: synced like any file (its old
    // content kept in turn).
    write(&src, "baz~", b"baz~ v2 from SRC");
    write(&dst, "baz~", b"baz~ v1");
    // A hostile name with a user's NAME~ beside it.
    write(&src, os(HOSTILE), b"hostile v2 (new)");
    write(&dst, os(HOSTILE), b"hostile v1");
    write(&dst, os(&hostile_kept), b"the user's hostile~");
    // A dry run names the places the run takes.
    let r = ferry([
        OsString::from("sync"),
        "-b".into(),
        "-n".into(),
        "--json".into(),
        src.clone().into(),
        dst.clone().into(),
    ]);
    r.ok();
    let mut said: Vec<(Vec<u8>, Vec<u8>)> = json_lines(&r)
        .iter()
        .filter(|j| j.str_field("type") == Some("keep"))
        .map(|j| (raw_field(j, "path"), raw_field(j, "to")))
        .collect();
    said.sort();
    let mut want: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (HOSTILE.to_vec(), [HOSTILE, b"~1~"].concat()),
        (b"bar".to_vec(), b"bar~1~".to_vec()),
        (b"baz~".to_vec(), b"baz~~".to_vec()),
        (b"foo".to_vec(), b"foo~1~".to_vec()),
    ];
    want.sort();
    assert_eq!(said, want, "{r}");
    let r = ferry([
        OsString::from("sync"),
        "-b".into(),
        src.clone().into(),
        dst.clone().into(),
    ]);
    r.ok();
    assert_eq!(read(&dst.join("foo")), b"foo v2 (new)");
    assert_eq!(read(&dst.join("foo~")), b"the user's own foo~", "{r}");
    assert_eq!(read(&dst.join("foo~1~")), b"foo v1", "{r}");
    assert_eq!(read(&dst.join("bar")), b"bar v2 (new)");
    assert_eq!(read(&dst.join("bar~")), b"bar~ from SRC", "{r}");
    assert_eq!(read(&dst.join("bar~1~")), b"bar v1", "{r}");
    assert_eq!(read(&dst.join("baz~")), b"baz~ v2 from SRC", "{r}");
    assert_eq!(read(&dst.join("baz~~")), b"baz~ v1", "{r}");
    assert_eq!(read(&named(&dst, HOSTILE)), b"hostile v2 (new)");
    assert_eq!(read(&named(&dst, &hostile_kept)), b"the user's hostile~");
    assert_eq!(
        read(&named(&dst, &[HOSTILE, b"~1~"].concat())),
        b"hostile v1",
        "{r}"
    );
    // A second update takes the next number: every keep stays.
    write(&src, "foo", b"foo v3 (newer)");
    let r = ferry([
        OsString::from("sync"),
        "-b".into(),
        src.clone().into(),
        dst.clone().into(),
    ]);
    r.ok();
    assert_eq!(read(&dst.join("foo")), b"foo v3 (newer)");
    assert_eq!(read(&dst.join("foo~")), b"the user's own foo~");
    assert_eq!(read(&dst.join("foo~1~")), b"foo v1");
    assert_eq!(read(&dst.join("foo~2~")), b"foo v2 (new)", "{r}");
    // SRC untouched, and its own names all present in DST as in SRC.
    for n in names(&src) {
        assert_eq!(read(&named(&dst, &n)), read(&named(&src, &n)));
    }
}

#[test]
fn backup_dir_keeps_never_replace_an_older_keep() {
    for (suffix, first, second) in [("", "d/f", "d/f~1~"), (".bak", "d/f.bak", "d/f.bak1.bak")] {
        let t = tmpdir();
        let (src, dst, bak) = (
            t.path().join("src"),
            t.path().join("dst"),
            t.path().join("bak"),
        );
        write(&dst, "d/f", b"f v1");
        for v in [&b"f v2 new"[..], b"f v3 (longer)"] {
            write(&src, "d/f", v);
            let mut args: Vec<OsString> =
                vec!["sync".into(), "--backup-dir".into(), bak.clone().into()];
            if !suffix.is_empty() {
                args.push("--suffix".into());
                args.push(suffix.into());
            }
            args.push(src.clone().into());
            args.push(dst.clone().into());
            ferry(&args).ok();
        }
        assert_eq!(read(&dst.join("d/f")), b"f v3 (longer)");
        assert_eq!(read(&bak.join(first)), b"f v1", "the first keep stays");
        assert_eq!(read(&bak.join(second)), b"f v2 new");
    }
}

// ---------------------------------------------------------------------------------------------
// Keeps on another filesystem, and restores: every attribute, ACL and hole
// ---------------------------------------------------------------------------------------------

/// A tmpfs of `mib` MiB mounted at `at`; unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, mib: u64) -> Result<Tmpfs, String> {
        if !is_root() {
            return Err("mounting a tmpfs needs root".into());
        }
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={mib}m,mode=755"))
            .arg("tmpfs")
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot mount a tmpfs here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A 1 GiB file with 1 MiB of data at 0, at the middle and at the end.
fn sparse_file(p: &Path, seed: u64) {
    let f = std::fs::File::create(p).unwrap();
    f.set_len(GIB).unwrap();
    for (i, at) in [0, GIB / 2, GIB - MIB].into_iter().enumerate() {
        f.write_all_at(&gen_bytes(MIB as usize, seed + i as u64), at)
            .unwrap();
    }
}

/// The data regions `sparse_file` wrote, as read back from `p`, and its size.
fn sparse_data(p: &Path) -> (u64, Vec<Vec<u8>>) {
    let f = std::fs::File::open(p).unwrap();
    let mut out = Vec::new();
    for at in [0, GIB / 2, GIB - MIB, GIB / 4] {
        let mut b = vec![0u8; MIB as usize];
        f.read_exact_at(&mut b, at).unwrap();
        out.push(b);
    }
    (f.metadata().unwrap().len(), out)
}

fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Every attribute of `p` (name, value), read with the syscalls.
fn attrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = cpath(p);
    let mut names = vec![0u8; 65536];
    let n = rustix::fs::llistxattr(c.as_c_str(), &mut names[..]).unwrap();
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        let len = rustix::fs::lgetxattr(c.as_c_str(), cn.as_c_str(), &mut v[..]).unwrap();
        out.push((name.to_vec(), v[..len].to_vec()));
    }
    out.sort();
    out
}

/// An access ACL as the kernel's raw value: owner rw, user 65534 r, group
/// r, mask r, others nothing (mode 0640).
fn acl_value() -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, 65534),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

fn set_attr(p: &Path, name: &str, value: &[u8]) {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    rustix::fs::lsetxattr(
        c.as_c_str(),
        n.as_c_str(),
        value,
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap_or_else(|e| panic!("setxattr {name} on {}: {e}", p.display()));
}

/// Give `p` everything a keep must carry: attributes, an ACL, mode 0640,
/// an owner, an old mtime.
fn dress(p: &Path, tag: &str) {
    std::os::unix::fs::chown(p, Some(1234), Some(5678)).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o640)).unwrap();
    set_attr(p, "user.note", format!("note of {tag}").as_bytes());
    set_attr(p, "user.empty", b"");
    set_attr(p, "system.posix_acl_access", &acl_value());
    set_mtime(p, (1_700_000_000, 123_456_789));
}

/// What a faithful keep or restore shows of `p`: content (of the small
/// file), mode, owner, mtime, attributes.
#[derive(Debug, PartialEq)]
struct Faithful {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    attrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn faithful(p: &Path) -> Faithful {
    let m = std::fs::symlink_metadata(p).unwrap();
    Faithful {
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        mtime: (m.mtime(), m.mtime_nsec()),
        attrs: attrs(p),
    }
}

/// SRC and DST for the faithful tests: DST has `f` (dressed) and `big` (1
/// GiB, 3 MiB of data, dressed too); SRC has new contents of both.
/// SRC, DST, what DST's `f` and `big` carry, and `big`'s data.
type Sides = (PathBuf, PathBuf, Faithful, Faithful, (u64, Vec<Vec<u8>>));

fn two_sides(t: &Path) -> Sides {
    let (src, dst) = (t.join("src"), t.join("dst"));
    mkdirs(&src, "");
    mkdirs(&dst, "");
    write(&dst, "f", b"the old f, kept with all it has");
    dress(&dst.join("f"), "f");
    sparse_file(&dst.join("big"), 10);
    dress(&dst.join("big"), "big");
    write(&src, "f", b"the new f");
    sparse_file(&src.join("big"), 20);
    let (ff, fb, data) = (
        faithful(&dst.join("f")),
        faithful(&dst.join("big")),
        sparse_data(&dst.join("big")),
    );
    assert!(ff.attrs.len() == 3, "test setup: {ff:?}");
    (src, dst, ff, fb, data)
}

#[test]
fn backup_dir_on_another_filesystem_keeps_attributes_acls_owner_and_holes() {
    let t = tmpdir();
    let bak = t.path().join("bak");
    let _fs = need!(Tmpfs::mount(&bak, 64));
    let (src, dst, ff, fb, data) = two_sides(t.path());
    let r = ferry([
        OsString::from("sync"),
        "-X".into(),
        "-A".into(),
        "--backup-dir".into(),
        bak.clone().into(),
        src.clone().into(),
        dst.clone().into(),
    ]);
    // The update happens: the 1 GiB kept into 64 MiB takes its 3 MiB only.
    r.ok();
    assert_eq!(read(&dst.join("f")), b"the new f");
    assert_eq!(sparse_data(&dst.join("big")), sparse_data(&src.join("big")));
    assert_eq!(read(&bak.join("f")), b"the old f, kept with all it has");
    assert_eq!(faithful(&bak.join("f")), ff, "the kept f");
    assert_eq!(faithful(&bak.join("big")), fb, "the kept big");
    assert_eq!(sparse_data(&bak.join("big")), data);
    assert!(
        allocated(&bak.join("big")) <= 8 * MIB,
        "the kept copy of a sparse file is sparse: {} bytes allocated",
        allocated(&bak.join("big"))
    );
}

/// The version of `name` kept in `vdir` (the only one).
fn version_of(vdir: &Path, stem: &str) -> PathBuf {
    let v: Vec<PathBuf> = std::fs::read_dir(vdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{stem}~"))
        })
        .collect();
    assert_eq!(
        v.len(),
        1,
        "one version of {stem} in {}: {v:?}",
        vdir.display()
    );
    v[0].clone()
}

#[test]
fn versions_on_another_filesystem_and_restore_keep_attributes_acls_owner_and_holes() {
    let t = tmpdir();
    let (src, dst, ff, fb, data) = two_sides(t.path());
    let vdir = dst.join(".ferry-versions");
    let _fs = need!(Tmpfs::mount(&vdir, 64));
    let r = ferry([
        OsString::from("sync"),
        "-X".into(),
        "-A".into(),
        "--versions".into(),
        src.clone().into(),
        dst.clone().into(),
    ]);
    r.ok();
    assert_eq!(read(&dst.join("f")), b"the new f");
    let (vf, vb) = (version_of(&vdir, "f"), version_of(&vdir, "big"));
    assert_eq!(read(&vf), b"the old f, kept with all it has");
    assert_eq!(faithful(&vf), ff, "the version of f");
    assert_eq!(faithful(&vb), fb, "the version of big");
    assert_eq!(sparse_data(&vb), data);
    assert!(allocated(&vb) <= 8 * MIB, "{} allocated", allocated(&vb));
    // Restore puts back the bytes and everything else (the current files
    // are kept as versions first: the tmpfs holds them, holes kept).
    for name in ["f", "big"] {
        let r = ferry([OsString::from("restore"), dst.join(name).into()]);
        r.ok();
    }
    assert_eq!(read(&dst.join("f")), b"the old f, kept with all it has");
    assert_eq!(faithful(&dst.join("f")), ff, "the restored f");
    assert_eq!(faithful(&dst.join("big")), fb, "the restored big");
    assert_eq!(sparse_data(&dst.join("big")), data);
    assert!(
        allocated(&dst.join("big")) <= 8 * MIB,
        "the restored sparse file is sparse: {} allocated",
        allocated(&dst.join("big"))
    );
}

// ---------------------------------------------------------------------------------------------
// `ferry versions --json`: names as they are
// ---------------------------------------------------------------------------------------------

/// The raw bytes of JSON field `key` of `j`: `KEY_bytes` (base64) when
/// present, else the string.
fn raw_field(j: &Json, key: &str) -> Vec<u8> {
    match j.str_field(&format!("{key}_bytes")) {
        Some(b) => base64::engine::general_purpose::STANDARD.decode(b).unwrap(),
        None => j
            .str_field(key)
            .unwrap_or_else(|| panic!("no {key} in {j}"))
            .as_bytes()
            .to_vec(),
    }
}

#[test]
fn versions_json_gives_raw_paths_without_double_slashes() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    mkdirs(&src, "d");
    mkdirs(&dst, "d");
    let names: [&[u8]; 3] = [b"-n\nl.txt", b"bad\xff~x", b"~tilde"];
    for n in names {
        for d in [&b"d/"[..], b""] {
            write(&dst, os(&[d, n].concat()), b"v1");
            write(&src, os(&[d, n].concat()), b"v2 longer");
        }
    }
    let mut c = Command::new(bin());
    c.args([OsString::from("sync"), "--versions".into()])
        .arg(&src)
        .arg(&dst)
        .env("FERRY_TEST_NOW", "1795624423")
        .stdin(std::process::Stdio::null());
    run_within(c, std::time::Duration::from_secs(600)).ok();
    // The replica given with a trailing slash, and a file of it.
    let mut typed = dst.clone().into_os_string();
    typed.push("/");
    for (arg, want) in [
        (typed, 6),
        (named(&dst.join("d"), names[0]).into_os_string(), 1),
        (named(&dst, names[0]).into_os_string(), 1),
    ] {
        let r = ferry([OsString::from("versions"), "--json".into(), arg]);
        r.ok();
        let lines = json_lines(&r);
        assert_eq!(lines.len(), want, "{r}");
        for j in &lines {
            let rel = raw_field(j, "path");
            let (dir, name) = match rel.strip_prefix(b"d/") {
                Some(n) => (&b"d/"[..], n),
                None => (&b""[..], &rel[..]),
            };
            let (stem, ext) = match name.iter().rposition(|&c| c == b'.') {
                Some(i) if i > 0 => name.split_at(i),
                _ => (name, &b""[..]),
            };
            let mut want_where = dst.as_os_str().as_bytes().to_vec();
            want_where.extend_from_slice(b"/.ferry-versions/");
            want_where.extend_from_slice(dir);
            want_where.extend_from_slice(&[stem, b"~20261125-163343", ext].concat());
            let got = raw_field(j, "where");
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want_where),
                "{r}"
            );
            assert_eq!(got, want_where, "{r}");
            assert_eq!(read(Path::new(os(&got))), b"v1");
            let root = raw_field(j, "root");
            assert_eq!(root, dst.as_os_str().as_bytes(), "{r}");
            for w in [&got, &root] {
                assert!(!w.windows(2).any(|p| p == b"//"), "{r}");
            }
            assert!(j.get("size").is_some_and(|s| s.as_u64() == Some(2)), "{j}");
        }
    }
    // A non-UTF-8 name is a lossy string plus its exact bytes.
    let r = ferry([
        OsString::from("versions"),
        "--json".into(),
        named(&dst.join("d"), names[1]).into_os_string(),
    ]);
    let j = &json_lines(&r)[0];
    assert!(j.str_field("where_bytes").is_some(), "{r}");
    assert!(!j.str_field("where").unwrap().contains("\\x"), "{r}");
}

#[test]
fn a_keep_that_finds_no_room_replaces_nothing_and_leaves_no_temporary() {
    let t = tmpdir();
    let bak = t.path().join("bak");
    let _fs = need!(Tmpfs::mount(&bak, 1));
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let old = gen_bytes(3 << 20, 7);
    write(&dst, "dense", &old);
    write(&dst, "small", b"small v1");
    write(&src, "dense", b"new dense");
    write(&src, "small", b"small v2 (new)");
    let r = ferry([
        OsString::from("sync"),
        "--backup-dir".into(),
        bak.clone().into(),
        src.clone().into(),
        dst.clone().into(),
    ]);
    r.code_is(1);
    assert!(
        r.error_lines()
            .iter()
            .any(|l| l.contains("dense") && l.contains("keeping it at")),
        "{r}"
    );
    assert_eq!(read(&dst.join("dense")), old, "not replaced: nothing lost");
    assert_eq!(
        read(&dst.join("small")),
        b"small v2 (new)",
        "the rest goes on"
    );
    assert_eq!(read(&bak.join("small")), b"small v1");
    assert_eq!(names(&bak), vec![b"small".to_vec()], "no temporary left");
}

#[test]
fn restore_puts_back_attributes_acls_owner_mode_and_mtime() {
    need!(if is_root() {
        Ok(())
    } else {
        Err("giving a file another owner needs root")
    });
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&dst, "d/f", b"the old f");
    dress(&dst.join("d/f"), "f");
    let ff = faithful(&dst.join("d/f"));
    write(&src, "d/f", b"the new f, longer");
    ferry([
        OsString::from("sync"),
        "-X".into(),
        "-A".into(),
        "--versions".into(),
        src.clone().into(),
        dst.clone().into(),
    ])
    .ok();
    let r = ferry([OsString::from("restore"), dst.join("d/f").into()]);
    r.ok();
    assert_eq!(read(&dst.join("d/f")), b"the old f");
    assert_eq!(faithful(&dst.join("d/f")), ff, "the restored f\n{r}");
}

/// The same rule over ssh (`ferry serve` keeps) and SFTP (the server
/// renames and links): a user's `NAME~` and an older keep stay.
#[test]
fn remote_keeps_never_replace_a_users_file() {
    use crate::util::ssh::{ssh_at, ssh_server};
    let (rsh, host) = need!(ssh_server());
    for sftp in [false, true] {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        write(&dst, os(HOSTILE), b"v1");
        write(&dst, os(&[HOSTILE, b"~"].concat()), b"the user's");
        let mut args: Vec<OsString> =
            vec!["sync".into(), "-b".into(), "-e".into(), rsh.clone().into()];
        if sftp {
            args.push("--sftp".into());
        } else {
            args.push("--remote-ferry".into());
            args.push(bin());
        }
        args.push(src.clone().into());
        args.push(ssh_at(&host, &dst));
        for v in [&b"v2 (new)"[..], b"v3 (newer)"] {
            write(&src, os(HOSTILE), v);
            let r = ferry(&args);
            r.ok();
        }
        let got = |suffix: &[u8]| read(&named(&dst, &[HOSTILE, suffix].concat()));
        assert_eq!(got(b""), b"v3 (newer)", "sftp {sftp}");
        assert_eq!(got(b"~"), b"the user's", "sftp {sftp}");
        assert_eq!(got(b"~1~"), b"v1", "sftp {sftp}");
        assert_eq!(got(b"~2~"), b"v2 (new)", "sftp {sftp}");
    }
}

/// A ramfs mounted at `at` (it keeps no extended attributes at all);
/// unmounted when dropped.
struct Ramfs(PathBuf);

impl Ramfs {
    fn mount(at: &Path) -> Result<Ramfs, String> {
        if !is_root() {
            return Err("mounting a ramfs needs root".into());
        }
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "ramfs", "ramfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot mount a ramfs here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Ramfs(at.to_path_buf()))
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A backup directory on a filesystem that keeps no attributes: the file
/// is kept without them (as a run's DST without attributes gets none);
/// a name the keep cannot take (255 bytes plus the suffix: too long) is
/// neither kept nor replaced, said on stderr, exit 1, nothing left over.
#[test]
fn backup_dir_without_attributes_or_room_for_a_name_loses_nothing() {
    let t = tmpdir();
    let bak = t.path().join("bak");
    let _fs = need!(Ramfs::mount(&bak));
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let long = [&b"-\n"[..], &[b'x'; 253]].concat();
    assert_eq!(long.len(), 255);
    write(&dst, "plain", b"plain v1");
    set_attr(&dst.join("plain"), "user.note", b"not kept on ramfs");
    write(&dst, os(&long), b"long v1");
    write(&src, "plain", b"plain v2 (new)");
    write(&src, os(&long), b"long v2 (new)");
    let r = ferry([
        OsString::from("sync"),
        "-X".into(),
        "--backup-dir".into(),
        bak.clone().into(),
        "--suffix".into(),
        ".bak".into(),
        src.clone().into(),
        dst.clone().into(),
    ]);
    r.code_is(1);
    assert_eq!(read(&dst.join("plain")), b"plain v2 (new)");
    assert_eq!(read(&bak.join("plain.bak")), b"plain v1");
    assert_eq!(read(&named(&dst, &long)), b"long v1", "not replaced\n{r}");
    let errs = r.error_lines();
    assert!(
        errs.iter()
            .any(|l| l.contains("xxxx") && l.contains("keeping it at")),
        "the long name said on stderr\n{r}"
    );
    assert_eq!(
        names(&bak),
        vec![b"plain.bak".to_vec()],
        "no temporary left\n{r}"
    );
}

/// `ferry versions` and `ferry restore` of a file over ssh: the file is
/// found (it is no directory to look into), and the restore puts back its
/// attributes as a local one does.
#[test]
fn versions_and_restore_of_a_file_over_ssh() {
    use crate::util::ssh::{ferry_ssh, ssh_at, ssh_server};
    let (rsh, host) = need!(ssh_server());
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&dst, "d/f", b"old f");
    set_attr(&dst.join("d/f"), "user.note", b"kept");
    write(&src, "d/f", b"new f, longer");
    ferry([
        OsString::from("sync"),
        "-X".into(),
        "--versions".into(),
        src.clone().into(),
        dst.clone().into(),
    ])
    .ok();
    let at = ssh_at(&host, &dst.join("d/f"));
    let r = ferry_ssh(&rsh, "versions", &[OsString::from("--json"), at.clone()]);
    r.ok();
    let lines = json_lines(&r);
    assert_eq!(lines.len(), 1, "{r}");
    let w = raw_field(&lines[0], "where");
    assert!(!w.windows(2).any(|p| p == b"//"), "{r}");
    ferry_ssh(&rsh, "restore", &[at]).ok();
    assert_eq!(read(&dst.join("d/f")), b"old f");
    assert_eq!(
        attrs(&dst.join("d/f")),
        vec![(b"user.note".to_vec(), b"kept".to_vec())]
    );
}
