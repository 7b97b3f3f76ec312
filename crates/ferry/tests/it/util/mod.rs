//! Shared helpers for the black-box tests of the `ferry` binary.
//!
//! Everything here uses std, tempfile and serde_json only (plus the `touch` and `mkfifo` utilities for
//! the few things std cannot do: symlink mtimes and fifos).
//!
//! (Over 800 lines: the one home of the test helpers every black-box test file shares.)
#![allow(dead_code)]

/// The value of `Ok`, or the test skipped with a line saying why (a
/// server or a permission the machine does not give; under `CI` set, a
/// failure: see [`skip`]). For the files that
/// declare `#[macro_use] mod util;`.
#[allow(unused_macros)]
macro_rules! need {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(why) => {
                $crate::util::skip(&why);
                return;
            }
        }
    };
}

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, FileTimes, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One skip policy: a test that cannot run for want of a server or a
/// privilege (root, mount, another user) says so on stderr and passes, but
/// fails when the `CI` environment variable is set (`.ci/run` sets it):
/// there every server and privilege is there, and a skip would hide a
/// broken set-up. (What the kernel or filesystem cannot do, such as user
/// xattrs on tmpfs, is said and skipped everywhere.)
pub fn skip(why: &dyn fmt::Display) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0") {
        panic!("CI is set and this test cannot run: {why}");
    }
    eprintln!("skipped: {why}");
}

pub mod s3;
pub mod s3proxy;
pub mod ssh;
pub mod watch;

/// Path of the binary under test (`FERRY_TEST_BIN` overrides it, e.g. to check the tests
/// themselves against a reference implementation).
pub fn bin() -> OsString {
    std::env::var_os("FERRY_TEST_BIN")
        .unwrap_or_else(|| OsString::from(env!("CARGO_BIN_EXE_ferry")))
}

pub fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

pub fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ferry-it-")
        .tempdir()
        .expect("tempdir")
}

/// True when the tests run as uid 0 (root can read anything and chown).
pub fn is_root() -> bool {
    let f = tempfile::tempfile().expect("tempfile");
    f.metadata().expect("metadata").uid() == 0
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness (no rand crate): SplitMix64.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform-ish in `lo..hi` (hi exclusive, hi > lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(hi > lo);
        lo + self.next_u64() % (hi - lo)
    }
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.range(0, den) < num
    }
}

/// Write a file of `0..max_size` pseudo-random bytes at `root/rel` with a mode among the
/// common ones, all drawn from `rng`.
pub fn write_random(root: &Path, rel: &str, max_size: u64, rng: &mut Rng) -> PathBuf {
    const MODES: [u32; 5] = [0o644, 0o600, 0o755, 0o640, 0o444];
    let size = rng.range(0, max_size) as usize;
    let p = write(root, rel, &gen_bytes(size, rng.next_u64()));
    chmod(&p, MODES[rng.range(0, MODES.len() as u64) as usize]);
    p
}

/// `len` pseudo-random bytes derived from `seed`.
pub fn gen_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// 64-bit content fingerprint for snapshots (word-at-a-time so it is fast in debug builds).
pub fn fingerprint(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ data.len() as u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap());
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
    }
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ (h >> 32)
}

// ---------------------------------------------------------------------------------------------
// Building trees
// ---------------------------------------------------------------------------------------------

/// Time as (seconds since epoch, nanoseconds).
pub type Mtime = (i64, u32);

pub fn mtime_ns(t: Mtime) -> i128 {
    i128::from(t.0) * 1_000_000_000 + i128::from(t.1)
}

fn systime(t: Mtime) -> SystemTime {
    assert!(
        t.0 >= 0,
        "only non-negative mtimes are supported by the helpers"
    );
    UNIX_EPOCH + Duration::new(t.0 as u64, t.1)
}

/// Paths and file contents of a tree (what bisync keeps: no directory
/// metadata).
pub fn content(root: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    walk(root)
        .into_iter()
        .map(|p| {
            let full = root.join(&p);
            let data = full.is_file().then(|| fs::read(&full).unwrap());
            (p, data)
        })
        .collect()
}

/// Write `data` to `root/rel`, creating parent directories.
pub fn write(root: &Path, rel: impl AsRef<Path>, data: &[u8]) -> PathBuf {
    let p = root.join(rel);
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir -p {}: {e}", parent.display()));
    }
    fs::write(&p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

/// Rewrite an existing file in place (same inode), keeping its mode and mtime.
pub fn rewrite_keep_meta(p: &Path, data: &[u8]) {
    let md = fs::symlink_metadata(p).unwrap();
    let mode = md.mode() & 0o7777;
    let t = (md.mtime(), md.mtime_nsec() as u32);
    fs::set_permissions(p, fs::Permissions::from_mode(mode | 0o600)).unwrap();
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(p)
        .unwrap();
    f.write_all(data).unwrap();
    drop(f);
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    set_mtime(p, t);
}

pub fn mkdirs(root: &Path, rel: impl AsRef<Path>) -> PathBuf {
    let p = root.join(rel);
    fs::create_dir_all(&p).unwrap_or_else(|e| panic!("mkdir -p {}: {e}", p.display()));
    p
}

pub fn ln(root: &Path, rel: impl AsRef<Path>, target: impl AsRef<OsStr>) -> PathBuf {
    let p = root.join(rel);
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    symlink(Path::new(target.as_ref()), &p)
        .unwrap_or_else(|e| panic!("symlink {}: {e}", p.display()));
    p
}

pub fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, p.display()));
}

pub fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().expect("run mkfifo");
    assert!(st.success(), "mkfifo {} failed", p.display());
}

/// `new`, or when it equals `old` a time one nanosecond away: an edit that must show.
pub fn differ(new: Mtime, old: Mtime) -> Mtime {
    if new == old {
        (new.0, (new.1 + 1) % 1_000_000_000)
    } else {
        new
    }
}

/// Set the mtime (with nanoseconds) of a file, directory or symlink (not followed).
pub fn set_mtime(p: &Path, t: Mtime) {
    let md = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    // Only regular files and directories are opened (opening a fifo would block); negative
    // times go through touch as well.
    if (md.is_file() || md.is_dir()) && t.0 >= 0 {
        if let Ok(f) = File::open(p) {
            if f.set_times(FileTimes::new().set_modified(systime(t)))
                .is_ok()
            {
                return;
            }
        }
    }
    let st = Command::new("touch")
        .arg("-h")
        .arg("-m")
        .arg("-d")
        .arg(touch_time(t))
        .arg(p)
        .status()
        .expect("run touch");
    assert!(st.success(), "touch -h {} failed", p.display());
}

/// `touch -d` argument for (sec, nsec) meaning sec + nsec/1e9 (also for negative sec).
fn touch_time(t: Mtime) -> String {
    if t.0 >= 0 {
        format!("@{}.{:09}", t.0, t.1)
    } else if t.1 == 0 {
        format!("@{}", t.0)
    } else {
        // sec + nsec/1e9 with sec < 0 is -(|sec| - 1) - (1e9 - nsec)/1e9
        format!("@-{}.{:09}", -(t.0 + 1), 1_000_000_000 - t.1)
    }
}

pub fn get_mtime(p: &Path) -> Mtime {
    let md = fs::symlink_metadata(p).unwrap();
    (md.mtime(), md.mtime_nsec() as u32)
}

/// Metadata of one entry of a tree spec. `mode` is ignored for symlinks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub mode: u32,
    pub mtime: Mtime,
    pub owner: Option<(u32, u32)>,
}

impl Meta {
    pub fn new(mode: u32, mtime: Mtime) -> Self {
        Meta {
            mode,
            mtime,
            owner: None,
        }
    }
}

/// A tree description that `materialize` turns into real files.
#[derive(Clone, Debug)]
pub enum Node {
    File {
        data: Vec<u8>,
        meta: Meta,
    },
    Dir {
        entries: BTreeMap<OsString, Node>,
        meta: Meta,
    },
    Symlink {
        target: OsString,
        meta: Meta,
    },
}

/// Create `node` at `path` (a Dir root may already exist). Metadata of directories is set
/// after their content, so the final mtimes are exactly the requested ones.
pub fn materialize(path: &Path, node: &Node) {
    match node {
        Node::File { data, meta } => {
            fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            if let Some((u, g)) = meta.owner {
                lchown(path, Some(u), Some(g)).unwrap();
            }
            chmod(path, meta.mode);
            set_mtime(path, meta.mtime);
        }
        Node::Dir { entries, meta } => {
            if !path.is_dir() {
                fs::create_dir(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
            }
            for (name, child) in entries {
                materialize(&path.join(name), child);
            }
            if let Some((u, g)) = meta.owner {
                lchown(path, Some(u), Some(g)).unwrap();
            }
            chmod(path, meta.mode);
            set_mtime(path, meta.mtime);
        }
        Node::Symlink { target, meta } => {
            symlink(Path::new(target), path)
                .unwrap_or_else(|e| panic!("symlink {}: {e}", path.display()));
            if let Some((u, g)) = meta.owner {
                lchown(path, Some(u), Some(g)).unwrap();
            }
            set_mtime(path, meta.mtime);
        }
    }
}

/// All entries under `root` (not the root itself), depth first, children sorted by name,
/// symlinks not followed. Paths are relative to `root`.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    fn rec(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
        let dir = root.join(rel);
        // Below the root, what vanishes while it is read (a watch test
        // polls a tree ferry is writing: its temporaries come and go) is
        // left out; the root itself must be there.
        let gone = |e: &std::io::Error| {
            !rel.as_os_str().is_empty() && e.kind() == std::io::ErrorKind::NotFound
        };
        let names: Vec<OsString> = match fs::read_dir(&dir) {
            Ok(rd) => rd.map(|e| e.unwrap().file_name()).collect(),
            Err(e) if gone(&e) => return,
            Err(e) => panic!("read_dir {}: {e}", dir.display()),
        };
        let mut names = names;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for n in names {
            let r = rel.join(&n);
            let md = match fs::symlink_metadata(root.join(&r)) {
                Ok(md) => md,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => panic!("{}: {e}", root.join(&r).display()),
            };
            out.push(r.clone());
            if md.is_dir() {
                rec(root, &r, out);
            }
        }
    }
    let mut out = Vec::new();
    rec(root, Path::new(""), &mut out);
    out
}

/// Give every entry under `root` (and the root) a distinct mtime with nanoseconds,
/// children before parents, so directory mtimes stick.
pub fn stamp_tree(root: &Path, base_sec: i64) {
    let mut all = walk(root);
    all.reverse(); // children come after parents in `walk`; reversed = children first
    let mut i: i64 = 0;
    for rel in all {
        i += 1;
        set_mtime(
            &root.join(&rel),
            (base_sec + i * 37, ((i * 7919 + 13) % 1_000_000_000) as u32),
        );
    }
    set_mtime(root, (base_sec - 1000, 123_456_789));
}

/// Names (relative paths) of all entries under `root` whose file name starts with `prefix`.
pub fn find_prefixed(root: &Path, prefix: &[u8]) -> Vec<PathBuf> {
    walk(root)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .map(|n| n.as_bytes().starts_with(prefix))
                .unwrap_or(false)
        })
        .collect()
}

/// Start of ferry's reserved temporary names (`.ferry-tmp-<16 hex>.~ferry~`).
pub const TMP_PREFIX: &[u8] = b".ferry-tmp-";

/// RAII: `chattr -i` the given paths when dropped (so tempdirs can be removed).
pub struct Immutable(pub Vec<PathBuf>);

impl Immutable {
    /// Try to make `p` immutable; None when chattr is unavailable or not permitted here.
    pub fn try_set(p: &Path) -> Option<Immutable> {
        let ok = Command::new("chattr")
            .arg("+i")
            .arg(p)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        // Verify it really is immutable: an append must fail.
        if ok && OpenOptions::new().append(true).open(p).is_err() {
            Some(Immutable(vec![p.to_path_buf()]))
        } else {
            if ok {
                let _ = Command::new("chattr").arg("-i").arg(p).status();
            }
            None
        }
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("chattr")
                .arg("-i")
                .arg(p)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running ferry
// ---------------------------------------------------------------------------------------------

pub struct Run {
    pub args: Vec<OsString>,
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Run {
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// stdout and stderr together (for "is this mentioned somewhere" checks).
    pub fn all(&self) -> String {
        format!("{}{}", self.out(), self.err())
    }
    #[track_caller]
    pub fn code_is(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "unexpected exit status\n{self}");
        self
    }
    #[track_caller]
    pub fn ok(&self) -> &Self {
        self.code_is(0)
    }
    /// Lines of stderr of the form `ferry: PATH: cause`.
    pub fn error_lines(&self) -> Vec<String> {
        self.err()
            .lines()
            .filter(|l| l.starts_with("ferry: "))
            .map(str::to_owned)
            .collect()
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "command: ferry {:?}", self.args)?;
        writeln!(f, "exit: {:?}", self.code)?;
        let out = self.out();
        let err = self.err();
        let cut = |s: &str| -> String {
            if s.len() > 6000 {
                let mut end = 6000;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}... [{} bytes total]", &s[..end], s.len())
            } else {
                s.to_owned()
            }
        };
        writeln!(f, "--- stdout ---\n{}", cut(&out))?;
        write!(f, "--- stderr ---\n{}", cut(&err))
    }
}

/// Longest a single ferry run may take before the test gives up (a hang guard, not a
/// performance assertion).
const HANG_GUARD: Duration = Duration::from_secs(600);

/// Run ferry with `args`, capture stdout, stderr and exit code.
pub fn ferry<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new(bin());
    c.args(args).stdin(Stdio::null());
    run_within(c, HANG_GUARD)
}

/// Run `cmd` (ferry) to its end and capture what it printed; panics (after killing it) when
/// it has not ended within `bound`: a hang guard, not a performance assertion.
pub fn run_within(mut cmd: Command, bound: Duration) -> Run {
    let args: Vec<OsString> = cmd.get_args().map(|a| a.to_owned()).collect();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferry");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(bound) {
        Ok(out) => {
            let out = out.expect("wait for ferry");
            Run {
                args,
                code: out.status.code(),
                stdout: out.stdout,
                stderr: out.stderr,
            }
        }
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("ferry {args:?} did not end within {bound:?} (hang guard)");
        }
    }
}

/// Start ferry without capturing output (for the kill tests).
pub fn spawn_ferry<I, S>(args: I) -> Child
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ferry")
}

/// `ferry CMD [extra...] SRC DST`, asserting that SRC is not touched at all.
pub fn run_on(cmd: &str, src: &Path, dst: &Path, extra: &[&str]) -> Run {
    let before = snapshot(src);
    let mut args: Vec<OsString> = vec![cmd.into()];
    args.extend(extra.iter().map(OsString::from));
    args.push(src.into());
    args.push(dst.into());
    let r = ferry(&args);
    let after = snapshot(src);
    let d = snapshot_diffs(&before, &after, true);
    assert!(d.is_empty(), "ferry modified SRC:\n{}\n{r}", d.join("\n"));
    r
}

// ---------------------------------------------------------------------------------------------
// Comparing trees
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

pub fn kind_of(md: &fs::Metadata) -> Kind {
    let ft = md.file_type();
    if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else {
        Kind::Other
    }
}

fn md_mtime_ns(md: &fs::Metadata) -> i128 {
    i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec())
}

fn md_ctime_ns(md: &fs::Metadata) -> i128 {
    i128::from(md.ctime()) * 1_000_000_000 + i128::from(md.ctime_nsec())
}

fn read_all(p: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    File::open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
        .read_to_end(&mut v)
        .unwrap();
    v
}

/// `root.join(rel)`, but an empty `rel` gives `root` itself (no trailing slash, which would
/// make lstat fail on a file root).
pub fn join(root: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

fn show(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        "<root>".to_owned()
    } else {
        format!("{:?}", p)
    }
}

fn compare_entry(a_root: &Path, b_root: &Path, rel: &Path, subset: bool, out: &mut Vec<String>) {
    let a = join(a_root, rel);
    let b = join(b_root, rel);
    let ma = fs::symlink_metadata(&a).unwrap_or_else(|e| panic!("lstat {}: {e}", a.display()));
    let mb = match fs::symlink_metadata(&b) {
        Ok(m) => m,
        Err(_) => {
            out.push(format!("{}: missing in DST", show(rel)));
            return;
        }
    };
    let (ka, kb) = (kind_of(&ma), kind_of(&mb));
    if ka != kb {
        out.push(format!(
            "{}: kind {:?} in SRC, {:?} in DST",
            show(rel),
            ka,
            kb
        ));
        return;
    }
    if ka != Kind::Symlink && ma.mode() & 0o7777 != mb.mode() & 0o7777 {
        out.push(format!(
            "{}: mode {:o} in SRC, {:o} in DST",
            show(rel),
            ma.mode() & 0o7777,
            mb.mode() & 0o7777
        ));
    }
    if md_mtime_ns(&ma) != md_mtime_ns(&mb) {
        out.push(format!(
            "{}: mtime {}.{:09} in SRC, {}.{:09} in DST",
            show(rel),
            ma.mtime(),
            ma.mtime_nsec(),
            mb.mtime(),
            mb.mtime_nsec()
        ));
    }
    if is_root_cached() && (ma.uid(), ma.gid()) != (mb.uid(), mb.gid()) {
        out.push(format!(
            "{}: owner {}:{} in SRC, {}:{} in DST",
            show(rel),
            ma.uid(),
            ma.gid(),
            mb.uid(),
            mb.gid()
        ));
    }
    match ka {
        Kind::File => {
            if ma.len() != mb.len() {
                out.push(format!(
                    "{}: size {} in SRC, {} in DST",
                    show(rel),
                    ma.len(),
                    mb.len()
                ));
            } else if read_all(&a) != read_all(&b) {
                out.push(format!("{}: content differs", show(rel)));
            }
        }
        Kind::Symlink => {
            let (ta, tb) = (fs::read_link(&a).unwrap(), fs::read_link(&b).unwrap());
            if ta != tb {
                out.push(format!(
                    "{}: link target {:?} in SRC, {:?} in DST",
                    show(rel),
                    ta,
                    tb
                ));
            }
        }
        Kind::Dir => {
            let names = |p: &Path| -> BTreeSet<OsString> {
                fs::read_dir(p)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect()
            };
            let (na, nb) = (names(&a), names(&b));
            for n in &na {
                compare_entry(a_root, b_root, &rel.join(n), subset, out);
            }
            if !subset {
                for n in nb.difference(&na) {
                    out.push(format!("{}: extra in DST", show(&rel.join(n))));
                }
            }
        }
        Kind::Other => {}
    }
}

fn is_root_cached() -> bool {
    use std::sync::OnceLock;
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(is_root)
}

/// All differences between the trees at `src` and `dst` (roots included).
pub fn tree_diffs(src: &Path, dst: &Path) -> Vec<String> {
    let mut out = Vec::new();
    compare_entry(src, dst, Path::new(""), false, &mut out);
    out
}

/// Differences for "DST contains everything in SRC" (extra DST entries allowed).
pub fn subset_diffs(src: &Path, dst: &Path) -> Vec<String> {
    let mut out = Vec::new();
    compare_entry(src, dst, Path::new(""), true, &mut out);
    out
}

fn fail_diffs(what: &str, d: &[String]) -> ! {
    let shown: Vec<&String> = d.iter().take(60).collect();
    panic!(
        "{what}: {} difference(s):\n{}",
        d.len(),
        shown
            .iter()
            .map(|s| format!("  {s}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

/// Same names, kinds, bytes, mtimes (ns), permission bits, link targets and (as root) owners.
#[track_caller]
pub fn assert_trees_equal(src: &Path, dst: &Path) {
    let d = tree_diffs(src, dst);
    if !d.is_empty() {
        fail_diffs(
            &format!("trees differ ({} vs {})", src.display(), dst.display()),
            &d,
        );
    }
}

/// Everything in `src` is in `dst` and equal; `dst` may have more.
#[track_caller]
pub fn assert_tree_contains(dst: &Path, src: &Path) {
    let d = subset_diffs(src, dst);
    if !d.is_empty() {
        fail_diffs(
            &format!("{} does not contain {}", dst.display(), src.display()),
            &d,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshots ("nothing changed")
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub mode: u32,
    pub mtime_ns: i128,
    /// 0 for directories (their st_size depends on history, not content).
    pub size: u64,
    /// `fingerprint` of the content for files, 0 otherwise.
    pub hash: u64,
    pub target: Option<OsString>,
    pub uid: u32,
    pub gid: u32,
    /// Only compared by the strict comparison.
    pub ino: u64,
    pub ctime_ns: i128,
}

/// Key: path relative to the root ("" is the root itself).
pub type Snapshot = BTreeMap<PathBuf, Entry>;

fn entry_of(p: &Path) -> Entry {
    let md = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let kind = kind_of(&md);
    let (size, hash) = match kind {
        Kind::File => (md.len(), fingerprint(&read_all(p))),
        Kind::Dir => (0, 0),
        _ => (md.len(), 0),
    };
    Entry {
        kind,
        mode: md.mode() & 0o7777,
        mtime_ns: md_mtime_ns(&md),
        size,
        hash,
        target: if kind == Kind::Symlink {
            Some(fs::read_link(p).unwrap().into_os_string())
        } else {
            None
        },
        uid: md.uid(),
        gid: md.gid(),
        ino: md.ino(),
        ctime_ns: md_ctime_ns(&md),
    }
}

/// Snapshot of a tree (or of a single file / symlink) at `root`. A missing root gives an
/// empty snapshot.
pub fn snapshot(root: &Path) -> Snapshot {
    let mut s = Snapshot::new();
    if fs::symlink_metadata(root).is_err() {
        return s;
    }
    s.insert(PathBuf::new(), entry_of(root));
    if fs::symlink_metadata(root).unwrap().is_dir() {
        for rel in walk(root) {
            let e = entry_of(&root.join(&rel));
            s.insert(rel, e);
        }
    }
    s
}

/// Differences between two snapshots; `strict` also compares inode numbers and ctimes
/// (i.e. "not even touched": no rewrite, chmod, utimes, rename).
pub fn snapshot_diffs(a: &Snapshot, b: &Snapshot, strict: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (k, ea) in a {
        match b.get(k) {
            None => out.push(format!("{}: disappeared", show(k))),
            Some(eb) => {
                let same = if strict {
                    ea == eb
                } else {
                    let mut x = ea.clone();
                    x.ino = eb.ino;
                    x.ctime_ns = eb.ctime_ns;
                    &x == eb
                };
                if !same {
                    out.push(format!(
                        "{}: changed\n    before {:?}\n    after  {:?}",
                        show(k),
                        ea,
                        eb
                    ));
                }
            }
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            out.push(format!("{}: appeared", show(k)));
        }
    }
    out
}

#[track_caller]
pub fn assert_same_content(before: &Snapshot, after: &Snapshot) {
    let d = snapshot_diffs(before, after, false);
    if !d.is_empty() {
        fail_diffs("snapshot changed", &d);
    }
}

#[track_caller]
pub fn assert_untouched(before: &Snapshot, after: &Snapshot) {
    let d = snapshot_diffs(before, after, true);
    if !d.is_empty() {
        fail_diffs("snapshot changed (strict: inode/ctime included)", &d);
    }
}

// ---------------------------------------------------------------------------------------------
// JSON (serde_json), with the accessors the tests use
// ---------------------------------------------------------------------------------------------

pub use serde_json::Value as Json;

/// What the tests read from a JSON value beyond serde_json's own accessors.
pub trait JsonExt {
    /// The string field `key` of an object.
    fn str_field(&self, key: &str) -> Option<&str>;
    /// An integer, exact (nanosecond mtimes do not fit in f64).
    fn as_i128(&self) -> Option<i128>;
}

impl JsonExt for Json {
    fn str_field(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Json::as_str)
    }
    fn as_i128(&self) -> Option<i128> {
        self.as_i64()
            .map(i128::from)
            .or_else(|| self.as_u64().map(i128::from))
    }
}

pub fn parse_json(s: &str) -> Result<Json, String> {
    serde_json::from_str(s).map_err(|e| e.to_string())
}

/// Parse every stdout line of a `--json` run (all must be JSON objects).
#[track_caller]
pub fn json_lines(r: &Run) -> Vec<Json> {
    let out = r.out();
    let mut v = Vec::new();
    for (i, line) in out.lines().enumerate() {
        match parse_json(line) {
            Ok(j @ Json::Object(_)) => v.push(j),
            Ok(_) => panic!(
                "stdout line {} is JSON but not an object: {line:?}\n{r}",
                i + 1
            ),
            Err(e) => panic!("stdout line {} is not JSON ({e}): {line:?}\n{r}", i + 1),
        }
    }
    v
}

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub entries_scanned: u64,
    pub files_copied: u64,
    pub bytes_copied: u64,
    pub files_deleted: u64,
    pub dirs_created: u64,
    pub unchanged: u64,
    pub errors: u64,
    pub elapsed_s: f64,
    /// `hard_links` (copy and sync; 0 where the summary has none, bisync).
    pub hard_links: u64,
}

/// The summary (last stdout line) of a `--json` run; checks that all lines are JSON, that every
/// other line is an action with a known type and a path, and that all fields are present.
#[track_caller]
pub fn summary(r: &Run) -> Summary {
    let lines = json_lines(r);
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no JSON output\n{r}"));
    assert_eq!(
        last.str_field("type"),
        Some("summary"),
        "last line is not the summary\n{r}"
    );
    for (i, l) in lines[..lines.len() - 1].iter().enumerate() {
        let t = l
            .str_field("type")
            .unwrap_or_else(|| panic!("line {} has no string type\n{r}", i + 1));
        assert!(
            [
                "copy", "update", "delete", "mkdir", "symlink", "mknod", "hardlink", "meta",
                "skip", "error", "keep"
            ]
            .contains(&t),
            "line {}: unknown action type {t:?}\n{r}",
            i + 1
        );
        assert!(
            l.get("path").is_some(),
            "line {}: action without path\n{r}",
            i + 1
        );
    }
    let n = |k: &str| -> u64 {
        last.get(k)
            .unwrap_or_else(|| panic!("summary lacks {k}\n{r}"))
            .as_u64()
            .unwrap_or_else(|| panic!("summary field {k} is not a non-negative integer\n{r}"))
    };
    let elapsed = last
        .get("elapsed_s")
        .unwrap_or_else(|| panic!("summary lacks elapsed_s\n{r}"))
        .as_f64()
        .unwrap_or_else(|| panic!("elapsed_s is not a number\n{r}"));
    assert!(elapsed >= 0.0, "negative elapsed_s\n{r}");
    Summary {
        entries_scanned: n("entries_scanned"),
        files_copied: n("files_copied"),
        bytes_copied: n("bytes_copied"),
        files_deleted: n("files_deleted"),
        dirs_created: n("dirs_created"),
        unchanged: n("unchanged"),
        errors: n("errors"),
        elapsed_s: elapsed,
        hard_links: last.get("hard_links").map_or(0, |_| n("hard_links")),
    }
}

/// Action lines (everything but the summary) of a `--json` run as (type, path).
pub fn actions(r: &Run) -> Vec<(String, String)> {
    let lines = json_lines(r);
    lines
        .iter()
        .filter(|l| l.str_field("type") != Some("summary"))
        .map(|l| {
            (
                l.str_field("type").unwrap_or("").to_owned(),
                l.str_field("path").unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Does `path` (as printed by ferry: relative, or absolute) name the relative path `rel`?
pub fn path_is(path: &str, rel: &str) -> bool {
    let p = path.trim_end_matches('/');
    p == rel || p.ends_with(&format!("/{rel}"))
}

pub fn has_action(acts: &[(String, String)], ty: &str, rel: &str) -> bool {
    acts.iter().any(|(t, p)| t == ty && path_is(p, rel))
}

/// Wait until `ready` (checked every 50 ms, `tries` times at most; then fail with `what`).
#[track_caller]
pub fn wait_until(what: &str, tries: u32, mut ready: impl FnMut() -> bool) {
    let mut waited = 0;
    while !ready() {
        std::thread::sleep(std::time::Duration::from_millis(50));
        waited += 1;
        assert!(waited < tries, "{what}");
    }
}
