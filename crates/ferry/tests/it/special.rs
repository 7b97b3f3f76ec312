//! Sparse files and special files: random sparse files (holes at the start, in the middle,
//! at the end) copied and synced keep their bytes and their `SEEK_DATA`/`SEEK_HOLE` maps;
//! random trees of fifos and device nodes keep type, device number, mode, owner and mtime;
//! sockets are skipped with a note; as an unprivileged user fifos are made and devices are
//! clear errors.

use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::OnceLock;

use crate::util::s3::each_server;
use crate::util::*;
use proptest::prelude::*;
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, SeekFrom, Timespec, Timestamps};
use rustix::io::Errno;

const BLOCK: u64 = 4096;

// ------------------------------------------------------------------------------------------
// Sparse files
// ------------------------------------------------------------------------------------------

/// The data segments of a file, as `SEEK_DATA`/`SEEK_HOLE` report them.
fn seek_map(p: &Path) -> Vec<(u64, u64)> {
    let f = fs::File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let size = f.metadata().unwrap().len();
    let mut out = Vec::new();
    let mut off = 0;
    while off < size {
        let data = match rfs::seek(f.as_fd(), SeekFrom::Data(off)) {
            Ok(d) => d,
            Err(Errno::NXIO) => break,
            Err(e) => panic!("SEEK_DATA {}: {e}", p.display()),
        };
        let hole = rfs::seek(f.as_fd(), SeekFrom::Hole(data)).unwrap();
        out.push((data, hole));
        off = hole;
    }
    out
}

/// Whether the filesystem of `dir` reports holes (asked once per test binary).
fn fs_has_holes(dir: &Path) -> bool {
    static HOLES: OnceLock<bool> = OnceLock::new();
    *HOLES.get_or_init(|| {
        let p = dir.join("hole-probe");
        let f = fs::File::create(&p).unwrap();
        f.write_all_at(&[1u8; 4096], 64 * BLOCK).unwrap();
        f.set_len(128 * BLOCK).unwrap();
        f.sync_all().unwrap();
        let map = seek_map(&p);
        fs::remove_file(&p).unwrap();
        map == vec![(64 * BLOCK, 65 * BLOCK)]
    })
}

/// [`fs_has_holes`], saying so when it does not (the test is then not run).
fn holes_here(dir: &Path) -> bool {
    let holes = fs_has_holes(dir);
    if !holes {
        eprintln!(
            "note: the filesystem of {} reports no holes: test not run",
            dir.display()
        );
    }
    holes
}

/// A file of `size` bytes whose only data are `segs` (offset, length, seed), the rest holes.
fn write_sparse(p: &Path, size: u64, segs: &[(u64, u64, u64)]) {
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).unwrap();
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(p)
        .unwrap();
    for &(off, len, seed) in segs {
        let len = len.min(size.saturating_sub(off));
        f.write_all_at(&gen_bytes(len as usize, seed), off).unwrap();
    }
    f.set_len(size).unwrap();
}

/// Bytes and hole maps of `a` and `b` are equal.
#[track_caller]
fn assert_same_sparse(a: &Path, b: &Path, r: &Run) {
    let map = seek_map(a);
    assert_eq!(
        map,
        seek_map(b),
        "SEEK_DATA/SEEK_HOLE map of {} (left: SRC, right: DST)\n{r}",
        b.display()
    );
    // Same sizes and holes: the bytes are equal when the data segments are.
    let (fa, fb) = (fs::File::open(a).unwrap(), fs::File::open(b).unwrap());
    assert_eq!(
        fa.metadata().unwrap().len(),
        fb.metadata().unwrap().len(),
        "size\n{r}"
    );
    for (start, end) in map {
        let mut x = vec![0u8; (end - start) as usize];
        let mut y = x.clone();
        fa.read_exact_at(&mut x, start).unwrap();
        fb.read_exact_at(&mut y, start).unwrap();
        assert!(x == y, "bytes of {} in {start}..{end}\n{r}", b.display());
    }
}

#[derive(Clone, Debug)]
struct SparseSpec {
    size: u64,
    segs: Vec<(u64, u64, u64)>,
}

fn sparse_spec() -> impl Strategy<Value = SparseSpec> {
    // Sizes of a few blocks up to 4 MiB, any byte count; segments anywhere (unaligned too),
    // so holes fall at the start, in the middle and at the end as it happens, and some
    // files have none.
    (2u64..1024, 0u64..BLOCK)
        .prop_flat_map(|(blocks, extra)| {
            let size = blocks * BLOCK + extra;
            (
                Just(size),
                prop::collection::vec((0..size, 1u64..6 * BLOCK, any::<u64>()), 0..6),
            )
        })
        .prop_map(|(size, segs)| SparseSpec { size, segs })
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Random sparse files, copied then synced after random new data: bytes equal and the
    /// hole maps equal, each time.
    #[test]
    fn sparse_files_keep_their_holes(
        files in prop::collection::vec(sparse_spec(), 1..5),
        more in prop::collection::vec((any::<prop::sample::Index>(), 0u64..1 << 22, 1u64..3 * BLOCK, any::<u64>()), 0..4),
    ) {
        let t = tmpdir();
        if !holes_here(t.path()) {
            return Ok(());
        }
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        for (i, f) in files.iter().enumerate() {
            write_sparse(&src.join(format!("d{}/f{i}", i % 2)), f.size, &f.segs);
        }
        let r = run_on("copy", &src, &dst, &[]);
        r.ok();
        for i in 0..files.len() {
            let rel = format!("d{}/f{i}", i % 2);
            assert_same_sparse(&src.join(&rel), &dst.join(&rel), &r);
        }
        // New data in some files (inside or past the end), then sync rewrites them.
        for (which, off, len, seed) in &more {
            let i = which.index(files.len());
            let p = src.join(format!("d{}/f{i}", i % 2));
            let f = OpenOptions::new().write(true).open(&p).unwrap();
            f.write_all_at(&gen_bytes(*len as usize, *seed), *off).unwrap();
        }
        let r = run_on("sync", &src, &dst, &[]);
        r.ok();
        for i in 0..files.len() {
            let rel = format!("d{}/f{i}", i % 2);
            assert_same_sparse(&src.join(&rel), &dst.join(&rel), &r);
        }
    }
}

/// A one-block hole in a file whose last block is nearly empty: its blocks are one sector
/// count short of its size, which a test rounding the size down to sectors called dense,
/// and the copy filled the hole (the proptest above met it about once in fifteen runs).
#[test]
fn a_hole_beside_a_nearly_empty_last_block_stays_a_hole() {
    let t = tmpdir();
    if !holes_here(t.path()) {
        return;
    }
    let src = t.path().join("src");
    // A hole at the start, in the middle and at the end, each one block, each beside a
    // last block holding a few bytes.
    // (name, size, data segments: offset, length, seed)
    type Seg = (u64, u64, u64);
    let files: [(&str, u64, &[Seg]); 3] = [
        ("start", 24_863, &[(BLOCK, 24_863 - BLOCK, 1)]),
        (
            "middle",
            12_438,
            &[(0, BLOCK, 2), (2 * BLOCK, 12_438 - 2 * BLOCK, 3)],
        ),
        (
            "late",
            4 * BLOCK + 100,
            &[(0, 2 * BLOCK, 4), (3 * BLOCK + 7, BLOCK + 93, 5)],
        ),
    ];
    for (name, size, segs) in files {
        write_sparse(&src.join(name), size, segs);
    }
    let dst = t.path().join("dst");
    let r = run_on("copy", &src, &dst, &[]);
    r.ok();
    for (name, ..) in files {
        assert_same_sparse(&src.join(name), &dst.join(name), &r);
    }
}

/// The example: 1 GiB with 1 MiB of data stays about 1 MiB on disk, with holes at
/// the start, in the middle and at the end; also through `--bwlimit` (the paced path) and
/// in bisync.
#[test]
fn a_gibibyte_with_a_mebibyte_of_data_stays_small() {
    let t = tmpdir();
    if !holes_here(t.path()) {
        return;
    }
    let src = t.path().join("src");
    let f = src.join("big.img");
    let segs = [(100 << 20, 512 << 10, 1), ((600 << 20) + 123, 512 << 10, 2)];
    write_sparse(&f, 1 << 30, &segs);
    let on_disk = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    assert!(on_disk(&f) < 2 << 20, "SRC itself is not sparse");
    for (cmd, extra) in [("copy", &[][..]), ("sync", &["--bwlimit", "1G"][..])] {
        let dst = t.path().join(cmd);
        // Not `run_on`: its snapshot of SRC would read the whole GiB.
        let mut args: Vec<OsString> = vec![cmd.into()];
        args.extend(extra.iter().map(OsString::from));
        args.extend([src.clone().into(), dst.clone().into()]);
        let r = ferry(&args);
        r.ok();
        assert_same_sparse(&f, &dst.join("big.img"), &r);
        assert!(
            on_disk(&dst.join("big.img")) < 2 << 20,
            "DST takes {} bytes\n{r}",
            on_disk(&dst.join("big.img"))
        );
    }
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write_sparse(&a.join("big.img"), 1 << 30, &segs);
    let mut args: Vec<OsString> = vec!["bisync".into(), a.clone().into(), b.clone().into()];
    args.extend(["--journal".into(), t.path().join("j.sqlite").into()]);
    let r = ferry(&args);
    r.ok();
    assert_same_sparse(&a.join("big.img"), &b.join("big.img"), &r);
}

// ------------------------------------------------------------------------------------------
// Fifos and device nodes
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Fifo,
    Char(u32, u32),
    Block(u32, u32),
}

#[derive(Clone, Debug)]
struct NodeSpec {
    node: Node,
    mode: u32,
    mtime: (i64, u32),
    owner: (u32, u32),
}

fn node_spec(devices: bool) -> impl Strategy<Value = NodeSpec> {
    let node = if devices {
        prop_oneof![
            Just(Node::Fifo),
            Just(Node::Char(1, 3)),
            (1u32..300, 0u32..2000).prop_map(|(a, b)| Node::Char(a, b)),
            (1u32..300, 0u32..2000).prop_map(|(a, b)| Node::Block(a, b)),
        ]
        .boxed()
    } else {
        Just(Node::Fifo).boxed()
    };
    (
        node,
        prop::sample::select(vec![0o600u32, 0o644, 0o666, 0o640, 0o4755, 0o000, 0o1777]),
        (1_000_000_000i64..1_900_000_000, 0u32..1_000_000_000),
        prop::sample::select(vec![(0u32, 0u32), (1000, 1000), (65534, 100)]),
    )
        .prop_map(|(node, mode, mtime, owner)| NodeSpec {
            node,
            mode,
            mtime,
            owner,
        })
}

fn make_node(p: &Path, s: &NodeSpec) {
    let (ft, dev) = match s.node {
        Node::Fifo => (FileType::Fifo, 0),
        Node::Char(a, b) => (FileType::CharacterDevice, rfs::makedev(a, b)),
        Node::Block(a, b) => (FileType::BlockDevice, rfs::makedev(a, b)),
    };
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    rfs::mknodat(rfs::CWD, p, ft, Mode::from_raw_mode(0o600), dev)
        .unwrap_or_else(|e| panic!("mknod {}: {e}", p.display()));
    if is_root() {
        rfs::chownat(
            rfs::CWD,
            p,
            Some(rfs::Uid::from_raw(s.owner.0)),
            Some(rfs::Gid::from_raw(s.owner.1)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }
    rfs::chmodat(rfs::CWD, p, Mode::from_raw_mode(s.mode), AtFlags::empty()).unwrap();
    let ts = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        last_modification: Timespec {
            tv_sec: s.mtime.0,
            tv_nsec: s.mtime.1 as _,
        },
    };
    rfs::utimensat(rfs::CWD, p, &ts, AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

/// Type, device number, mode, owner (as root) and mtime of `rel` equal in both trees.
#[track_caller]
fn assert_same_node(src: &Path, dst: &Path, rel: &str, r: &Run) {
    let a = fs::symlink_metadata(src.join(rel)).unwrap();
    let b = fs::symlink_metadata(dst.join(rel))
        .unwrap_or_else(|e| panic!("{rel} not in DST: {e}\n{r}"));
    let fields = |m: &fs::Metadata| {
        (
            m.mode() & 0o170000,
            m.rdev(),
            m.mode() & 0o7777,
            m.mtime(),
            m.mtime_nsec(),
            if is_root() {
                (m.uid(), m.gid())
            } else {
                (0, 0)
            },
        )
    };
    assert_eq!(
        fields(&a),
        fields(&b),
        "{rel}: (type, rdev, mode, mtime, ns, owner) SRC vs DST\n{r}"
    );
}

proptest! {
    #![proptest_config(config())]

    /// Random trees of fifos and (as root) device nodes beside files: copied with type,
    /// rdev, mode, owner and mtime; then changed (new device number, another type, a node
    /// gone, new mode and mtime) and synced: equal again, the gone one deleted.
    #[test]
    fn fifos_and_devices_are_recreated(
        nodes in prop::collection::vec(node_spec(is_root()), 1..8),
        changes in prop::collection::vec(node_spec(is_root()), 0..8),
    ) {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        write(&src, "file", b"data");
        let rel = |i: usize| format!("d{}/n{i}", i % 3);
        for (i, n) in nodes.iter().enumerate() {
            make_node(&src.join(rel(i)), n);
        }
        let r = run_on("copy", &src, &dst, &["--json"]);
        r.ok();
        let mknods = actions(&r).iter().filter(|(t, _)| t == "mknod").count();
        prop_assert_eq!(mknods, nodes.len(), "{}", r);
        for i in 0..nodes.len() {
            assert_same_node(&src, &dst, &rel(i), &r);
        }
        // Change: each change replaces node i (type, rdev, mode, mtime); the last node goes.
        for (i, c) in changes.iter().enumerate().take(nodes.len()) {
            fs::remove_file(src.join(rel(i))).unwrap();
            make_node(&src.join(rel(i)), c);
        }
        let gone = nodes.len() - 1;
        let removed = changes.len() < nodes.len();
        if removed {
            fs::remove_file(src.join(rel(gone))).unwrap();
        }
        let r = run_on("sync", &src, &dst, &[]);
        r.ok();
        for i in 0..nodes.len() {
            if removed && i == gone {
                prop_assert!(fs::symlink_metadata(dst.join(rel(i))).is_err(), "{} kept\n{}", rel(i), r);
            } else {
                assert_same_node(&src, &dst, &rel(i), &r);
            }
        }
        // A third run changes nothing.
        let r = run_on("sync", &src, &dst, &["--json"]);
        r.ok();
        prop_assert!(actions(&r).is_empty(), "{}", r);
    }
}

/// A SRC socket: one note naming it, in SRC, and why; nothing in DST; exit 0. A fifo, a
/// file and a directory in DST where SRC has a fifo or a file are replaced by sync.
#[test]
fn sockets_are_skipped_with_one_note_each() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src, "f", b"f");
    fs::create_dir_all(src.join("sub")).unwrap();
    let _l = std::os::unix::net::UnixListener::bind(src.join("sub/sock")).unwrap();
    let r = run_on("copy", &src, &dst, &[]);
    r.ok();
    let notes: Vec<String> = r
        .err()
        .lines()
        .filter(|l| l.contains("sock"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        notes,
        vec!["ferry: skipped sub/sock (socket in SRC: not copied (a socket is only an address that a running program listens on; ferry does not recreate it))".to_owned()],
        "{r}"
    );
    assert!(fs::symlink_metadata(dst.join("sub/sock")).is_err(), "{r}");
}

/// Type changes between runs: a fifo where DST has a file or directory, a file where DST
/// has a fifo: sync replaces; copy replaces files and nodes but never a directory.
#[test]
fn nodes_replace_and_are_replaced_by_other_kinds() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let fifo = NodeSpec {
        node: Node::Fifo,
        mode: 0o640,
        mtime: (1_600_000_000, 5),
        owner: (0, 0),
    };
    make_node(&src.join("was_file"), &fifo);
    make_node(&src.join("was_dir"), &fifo);
    write(&src, "was_fifo", b"now a file");
    write(&dst, "was_file", b"old");
    write(&dst, "was_dir/inner", b"old");
    make_node(&dst.join("was_fifo"), &fifo);
    let r = run_on("copy", &src, &dst, &[]);
    r.code_is(1);
    assert!(r.error_lines().iter().any(|l| l.contains("was_dir")), "{r}");
    assert_same_node(&src, &dst, "was_file", &r);
    assert_eq!(fs::read(dst.join("was_fifo")).unwrap(), b"now a file");
    let r = run_on("sync", &src, &dst, &[]);
    r.ok();
    assert_same_node(&src, &dst, "was_dir", &r);
    assert_trees_equal(&src, &dst);
}

/// As an unprivileged user: fifos are made, each device node is one clear error naming it
/// and EPERM, everything else is copied, exit 1.
#[test]
fn unprivileged_fifos_work_devices_are_clear_errors() {
    if !is_root() {
        eprintln!("note: needs root to make device nodes and switch to user nobody: skipped");
        return;
    }
    let t = tmpdir();
    let base = t.path().join("home");
    fs::create_dir(&base).unwrap();
    let bin_copy = base.join("ferry");
    fs::copy(bin(), &bin_copy).unwrap();
    let (src, dst) = (base.join("src"), base.join("dst"));
    write(&src, "f", b"f");
    let spec = |node| NodeSpec {
        node,
        mode: 0o644,
        mtime: (1_500_000_000, 7),
        owner: (65534, 65534),
    };
    make_node(&src.join("fifo"), &spec(Node::Fifo));
    make_node(&src.join("dev/null2"), &spec(Node::Char(1, 3)));
    make_node(&src.join("dev/blk"), &spec(Node::Block(7, 0)));
    write(&src, "dev/z", b"z");
    for e in walk(&base)
        .into_iter()
        .map(|r| base.join(r))
        .chain([base.clone()])
    {
        std::os::unix::fs::lchown(&e, Some(65534), Some(65534)).unwrap();
    }
    rfs::chmodat(
        rfs::CWD,
        t.path(),
        Mode::from_raw_mode(0o755),
        AtFlags::empty(),
    )
    .unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin_copy)
        .args([OsStr::new("copy"), src.as_os_str(), dst.as_os_str()])
        .output()
        .expect("run setpriv");
    let r = Run {
        args: vec!["copy (as nobody)".into()],
        code: out.status.code(),
        stdout: out.stdout,
        stderr: out.stderr,
    };
    assert!(!r.err().contains("setpriv:"), "setpriv failed\n{r}");
    r.code_is(1);
    assert_eq!(
        r.error_lines(),
        vec![
            "ferry: dev/blk: block device 7,0 not created: Operation not permitted (EPERM: only root can create device nodes)".to_owned(),
            "ferry: dev/null2: character device 1,3 not created: Operation not permitted (EPERM: only root can create device nodes)".to_owned(),
        ],
        "{r}"
    );
    assert_same_node(&src, &dst, "fifo", &r);
    assert_eq!(fs::read(dst.join("dev/z")).unwrap(), b"z");
    assert!(fs::symlink_metadata(dst.join("dev/null2")).is_err());
}

/// To S3: fifos cannot be stored: one note for the run, a `skip` record for each, the
/// files uploaded, exit 0. A sparse file goes up with its holes as zeros and comes back
/// with the same bytes.
#[test]
fn s3_skips_fifos_with_one_note() {
    each_server(|s3| {
        let t = tmpdir();
        let src = t.path().join("src");
        write(&src, "f", b"f");
        for x in ["p1", "d/p2", "d/p3"] {
            fs::create_dir_all(src.join(x).parent().unwrap()).unwrap();
            mkfifo(&src.join(x));
        }
        write_sparse(&src.join("sparse"), 300_000, &[(100_000, 5000, 9)]);
        let url = s3.url("special");
        let r = s3.ferry([
            OsStr::new("copy"),
            OsStr::new("--json"),
            src.as_os_str(),
            OsStr::new(&url),
        ]);
        r.ok();
        let err = r.err();
        let notes: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("ferry: skipped"))
            .collect();
        assert_eq!(notes.len(), 1, "{r}");
        assert!(
            notes[0].contains("the destination cannot store special files (fifos, device nodes)"),
            "{r}"
        );
        let skips: Vec<String> = actions(&r)
            .into_iter()
            .filter(|(t, _)| t == "skip")
            .map(|(_, p)| p)
            .collect();
        assert_eq!(skips.len(), 3, "{r}");
        let back = t.path().join("back");
        let r = s3.ferry([OsStr::new("copy"), OsStr::new(&url), back.as_os_str()]);
        r.ok();
        assert_eq!(fs::read(back.join("f")).unwrap(), b"f");
        assert_eq!(
            fs::read(back.join("sparse")).unwrap(),
            fs::read(src.join("sparse")).unwrap()
        );
        assert!(fs::symlink_metadata(back.join("p1")).is_err());
    });
}
