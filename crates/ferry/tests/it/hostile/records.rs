//! Hostile tests: records (see main.rs). The rollback records of patches
//! in place: planted by another user in a shared (1777) directory, left by
//! a killed run and then raced by another writer, and a single-file rerun
//! after a kill (locally and over ssh). Invariants: no file outside what
//! the run was asked to write changes, no mode bit is gained, a write made
//! after the kill is never undone, a read-only command writes nothing.
#[allow(unused_imports)]
use crate::util::*;

use std::ffi::OsStr;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::ssh::{dying_ferry, ssh_at, ssh_server};

/// The record's name beside file `name` (ferry's reserved name).
fn record_of(dir: &Path, name: &[u8]) -> PathBuf {
    let rec = ferry_engine::store::undo_name(name);
    dir.join(OsStr::new(rec.to_str().unwrap()))
}

/// Write `bytes` to `path` as user nobody (a file it then owns).
fn plant_as_nobody(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut c = Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "sh",
            "-c",
            "cat > \"$1\"",
            "sh",
        ])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("setpriv: {e}"))?;
    c.stdin.take().unwrap().write_all(bytes).unwrap();
    let st = c.wait().unwrap();
    if !st.success() {
        return Err(format!("setpriv could not write as nobody: {st}"));
    }
    Ok(())
}

/// A record as ferry before issue 28 wrote them (format 2): it rolled
/// back whatever it named with whatever it held.
fn format_2(ino: u64, size: u64, mode: u32, name: &[u8], bytes: &[u8]) -> Vec<u8> {
    let mut b = b"ferry-undo 2\n".to_vec();
    for v in [ino, size, size, 1_000_000_000] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&mode.to_le_bytes());
    b.extend_from_slice(&(name.len() as u32).to_le_bytes());
    b.extend_from_slice(name);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    b.extend_from_slice(bytes);
    let sum = blake3::hash(&b);
    b.extend_from_slice(sum.as_bytes());
    b
}

/// A record of today's format (3), whole and well formed, saying the
/// file at `p` (named `name`) is as the killed run left it: its block 0
/// holds its current bytes as the "old" ones, its ctime is the one left.
fn format_3(p: &Path, mode: u32, name: &[u8]) -> Vec<u8> {
    let md = std::fs::metadata(p).unwrap();
    let now = std::fs::read(p).unwrap();
    let mut b = b"ferry-undo 3\n".to_vec();
    for v in [md.ino(), md.len(), md.len(), 1_000_000_000] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&mode.to_le_bytes());
    b.extend_from_slice(&(name.len() as u32).to_le_bytes());
    b.extend_from_slice(name);
    b.extend_from_slice(&[7u8; 32]);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(now.len() as u64).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&now);
    let sum = blake3::hash(&b);
    b.extend_from_slice(sum.as_bytes());
    b.extend_from_slice(&md.ctime().to_le_bytes());
    b.extend_from_slice(&(md.ctime_nsec() as u32).to_le_bytes());
    b.extend_from_slice(&[0u8; 4]);
    b
}

/// (bytes, mode with the file type, uid) of `p`.
fn state(p: &Path) -> (Vec<u8>, u32, u32) {
    let md = std::fs::metadata(p).unwrap();
    (std::fs::read(p).unwrap(), md.mode(), md.uid())
}

/// Records planted by user nobody in a shared 1777 directory, naming
/// `../victim` (a root file outside it) and root's setuid file there, in
/// the format ferry wrote before and in today's, all asking for setuid
/// modes and other bytes: `ferry ls` (read-only) leaves everything, the
/// records too; a copy reading the directory and a sync writing into it,
/// run by root, change neither file's bytes nor mode, and say so.
#[test]
fn records_planted_in_a_shared_dir_change_no_root_file() {
    if !is_root() {
        crate::util::skip(&"not root (setpriv to nobody needs root)");
        return;
    }
    let d = tmpdir();
    chmod(d.path(), 0o755);
    let shared = mkdirs(d.path(), "shared");
    chmod(&shared, 0o1777);
    let victim = write(d.path(), "victim", b"root's secret bytes\n");
    chmod(&victim, 0o644);
    let suid = write(&shared, "tool", b"#!/bin/sh\necho root tool\n");
    chmod(&suid, 0o4755);
    let mine = shared.join("mine");
    need!(plant_as_nobody(&mine, b"nobody's own file\n"));
    chmod(&mine, 0o644);
    let before = [state(&victim), state(&suid), state(&mine)];
    let vino = std::fs::metadata(&victim).unwrap().ino();
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    // Format 2, `../victim`: its bytes replaced, setuid.
    let pwn = b"pwned by nobody!!!!\n";
    assert_eq!(pwn.len() as u64, size(&victim));
    let r1 = record_of(&shared, b"../victim");
    need!(plant_as_nobody(
        &r1,
        &format_2(vino, size(&victim), 0o104777, b"../victim", pwn)
    ));
    // Format 3, `../victim`, and root's tool with setuid-setgid-sticky
    // 0777 asked, and nobody's own file asking for setuid.
    let r2 = record_of(&shared, b"tool");
    need!(plant_as_nobody(&r2, &format_3(&suid, 0o107777, b"tool")));
    let r3 = record_of(&shared, b"mine");
    need!(plant_as_nobody(&r3, &format_3(&mine, 0o104644, b"mine")));
    let check = |what: &str| {
        let now = [state(&victim), state(&suid), state(&mine)];
        assert_eq!(now[0], before[0], "victim changed after {what}");
        assert_eq!(now[1], before[1], "root's setuid file changed after {what}");
        assert_eq!(now[2].0, before[2].0, "nobody's file changed after {what}");
        assert_eq!(
            now[2].1 & !before[2].1 & 0o7000,
            0,
            "a set-id bit gained after {what}"
        );
    };
    // Read-only: nothing written, nothing removed.
    ferry(["ls".as_ref(), shared.as_os_str()]).ok();
    check("ls");
    for r in [&r1, &r2, &r3] {
        assert!(r.exists(), "ferry ls removed {r:?}");
    }
    let out = d.path().join("out");
    ferry([
        "copy".as_ref(),
        "-n".as_ref(),
        shared.as_os_str(),
        out.as_os_str(),
    ])
    .ok();
    check("copy -n");
    assert!(
        r1.exists() && r2.exists() && r3.exists(),
        "a dry run removed a record"
    );
    // A copy reading the directory: the records are judged and go.
    let r = ferry(["copy".as_ref(), shared.as_os_str(), out.as_os_str()]);
    check("copy");
    assert!(r.err().contains("rollback record"), "not said\n{r}");
    assert!(!r1.exists() && !r2.exists(), "{r}");
    // Planted again, then a sync into the shared directory.
    need!(plant_as_nobody(
        &r1,
        &format_2(vino, size(&victim), 0o104777, b"../victim", pwn)
    ));
    need!(plant_as_nobody(&r2, &format_3(&suid, 0o107777, b"tool")));
    let src = d.path().join("src");
    write(&src, "tool", b"#!/bin/sh\necho root tool\n");
    write(&src, "mine", b"nobody's own file\n");
    let _ = ferry(["sync".as_ref(), src.as_os_str(), shared.as_os_str()]);
    assert_eq!(state(&victim), before[0], "victim changed after sync");
    assert_eq!(
        state(&suid).1 & !before[1].1 & 0o7777,
        0,
        "root's file gained a mode bit after sync"
    );
}

/// `data` with `n` edits of `len` bytes at fixed offsets spread over it
/// (same size), the offset of the first, and the bytes of the 8 KiB
/// blocks they touch.
fn scattered(data: &[u8], n: usize, len: usize) -> (Vec<u8>, usize, u64) {
    let mut v = data.to_vec();
    let mut blocks = std::collections::BTreeSet::new();
    for k in 0..n {
        let at = k * (v.len() / n) + 12345;
        for x in &mut v[at..at + len] {
            *x ^= 0xa5;
        }
        blocks.insert(at / 8192);
        blocks.insert((at + len - 1) / 8192);
    }
    (v, 12345, blocks.len() as u64 * 8192)
}

/// ferry with `args` and the test hooks `env` (in-place patches from
/// 1 MiB up; `FERRY_TEST_APPEND_DIE`: killed after so many bytes).
fn ferry_env(args: &[&OsStr], env: &[(&str, String)]) -> Run {
    let mut c = Command::new(bin());
    c.args(args).stdin(Stdio::null());
    c.env("FERRY_TEST_APPEND_MIN", (1u64 << 20).to_string());
    for (k, v) in env {
        c.env(k, v);
    }
    run_within(c, Duration::from_secs(600))
}

fn die(n: u64) -> (&'static str, String) {
    ("FERRY_TEST_APPEND_DIE", n.to_string())
}

/// Write `bytes` at `at` of `p` in place (another program).
fn write_at(p: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

/// A `--delta` patch in place killed half way, then another program
/// writes to the file (into a block the patch changed; or replaces its
/// whole content in the same inode; or appends): the next run that lists
/// the directory leaves the file as that program left it, removes the
/// record and says so in one line; the run after brings the copy up to
/// date.
#[test]
fn a_write_after_a_killed_patch_is_never_rolled_back() {
    let d = tmpdir();
    let (src, dst, out) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("out"),
    );
    let data = gen_bytes(4 << 20, 281);
    write(&src, "f", &data);
    ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
    let (new, first, literal) = scattered(&data, 12, 3000);
    write(&src, "f", &new);
    let f = dst.join("f");
    let a: Vec<&OsStr> = vec![
        "copy".as_ref(),
        "--delta".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ];
    type Writer = fn(&Path, usize) -> Vec<u8>;
    let writers: [(&str, Writer); 3] = [
        ("a write into a patched block", |p, first| {
            write_at(p, first as u64, b"WRITTEN AFTER THE KILL");
            std::fs::read(p).unwrap()
        }),
        ("the whole content replaced in the same inode", |p, _| {
            let other = gen_bytes(4 << 20, 999);
            std::fs::write(p, &other).unwrap();
            other
        }),
        ("an append", |p, _| {
            let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
            f.write_all(b"appended after the kill").unwrap();
            drop(f);
            std::fs::read(p).unwrap()
        }),
    ];
    for (what, w) in writers {
        let r = ferry_env(&a, &[die(literal / 2)]);
        assert!(r.code.is_none(), "not killed ({what})\n{r}");
        let rec: Vec<PathBuf> = find_prefixed(&dst, b".ferry-undo-")
            .iter()
            .map(|r| dst.join(r))
            .collect();
        assert_eq!(rec.len(), 1, "{what}");
        let ino = std::fs::metadata(&f).unwrap().ino();
        let theirs = w(&f, first);
        assert_eq!(std::fs::metadata(&f).unwrap().ino(), ino);
        let mtime = get_mtime(&f);
        // A read-only listing changes nothing.
        ferry(["ls".as_ref(), dst.as_os_str()]).ok();
        assert!(
            std::fs::read(&f).unwrap() == theirs,
            "ls changed it ({what})"
        );
        assert!(rec[0].exists(), "ls removed the record ({what})");
        // A run reading the directory: the other program's bytes stay.
        let r = ferry(["copy".as_ref(), dst.as_os_str(), out.as_os_str()]);
        assert!(
            std::fs::read(&f).unwrap() == theirs,
            "{what}: rolled back over a later write\n{r}"
        );
        assert_eq!(get_mtime(&f), mtime, "{what}: mtime reset");
        assert!(!rec[0].exists(), "{what}: stale record left");
        let said: Vec<_> = r
            .err()
            .lines()
            .filter(|l| l.contains("rollback record"))
            .map(str::to_owned)
            .collect();
        assert_eq!(said.len(), 1, "{what}: not said in one line\n{r}");
        assert!(said[0].contains("/dst/f"), "{what}: no path\n{r}");
        // The next copy brings DST up to date.
        ferry_env(&a, &[]).ok();
        assert!(std::fs::read(&f).unwrap() == new, "{what}: not converged");
        // Back to the old content for the next round.
        write(&src, "f", &data);
        ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
        write(&src, "f", &new);
    }
}

/// The same single-file command run again after a kill mid-patch: the
/// record is rolled back before the file is hashed, and the rerun leaves
/// the exact source bytes (locally with `--delta`).
#[test]
fn a_single_file_rerun_after_a_killed_patch_is_exact_locally() {
    let d = tmpdir();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = gen_bytes(4 << 20, 283);
    write(&src, "f", &data);
    ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
    let (new, _, literal) = scattered(&data, 12, 3000);
    write(&src, "f", &new);
    let (sf, df) = (src.join("f"), dst.join("f"));
    let a: Vec<&OsStr> = vec![
        "copy".as_ref(),
        "--delta".as_ref(),
        sf.as_os_str(),
        df.as_os_str(),
    ];
    let r = ferry_env(&a, &[die(literal / 2)]);
    assert!(r.code.is_none(), "not killed\n{r}");
    assert_eq!(find_prefixed(&dst, b".ferry-undo-").len(), 1);
    let r = ferry_env(&a, &[]);
    r.ok();
    assert!(
        std::fs::read(&df).unwrap() == new,
        "corrupted by the rerun\n{r}"
    );
    assert_eq!(get_mtime(&df), get_mtime(&sf));
    assert!(find_prefixed(&dst, b".ferry-undo-").is_empty());
}

/// The same over ssh: a single-file push whose remote `ferry serve` is
/// killed mid-patch, then the same push again; a single-file pull killed
/// mid-patch (the local end), then the same pull again: exact bytes.
#[test]
fn a_single_file_rerun_after_a_killed_patch_is_exact_over_ssh() {
    let (rsh, host) = need!(ssh_server());
    let d = tmpdir();
    let (src, dst, back) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("back"),
    );
    let data = gen_bytes(4 << 20, 285);
    write(&src, "f", &data);
    let (sf, df, bf) = (src.join("f"), dst.join("f"), back.join("f"));
    let rf = ssh_at(&host, &df);
    let with = |remote: &OsStr, from: &OsStr, to: &OsStr, env: &[(&str, String)]| {
        let a: Vec<&OsStr> = vec![
            "copy".as_ref(),
            "-e".as_ref(),
            rsh.as_ref(),
            "--remote-ferry".as_ref(),
            remote,
            from,
            to,
        ];
        ferry_env(&a, env)
    };
    let me = bin();
    mkdirs(d.path(), "dst");
    with(&me, sf.as_os_str(), &rf, &[]).ok();
    let (new, _, literal) = scattered(&data, 12, 3000);
    write(&src, "f", &new);
    // Push: the remote end dies mid-patch.
    let dying = dying_ferry(d.path(), literal / 2);
    let r = with(dying.as_os_str(), sf.as_os_str(), &rf, &[]);
    assert!(r.code != Some(0), "the remote end did not die\n{r}");
    assert_eq!(find_prefixed(&dst, b".ferry-undo-").len(), 1, "{r}");
    // `ls` over ssh only reads: the record and the file stay as they are.
    let half = std::fs::read(&df).unwrap();
    let dir = ssh_at(&host, &dst);
    let a: Vec<&OsStr> = vec![
        "ls".as_ref(),
        "-e".as_ref(),
        rsh.as_ref(),
        "--remote-ferry".as_ref(),
        me.as_os_str(),
        dir.as_os_str(),
    ];
    ferry_env(&a, &[]).ok();
    assert_eq!(find_prefixed(&dst, b".ferry-undo-").len(), 1, "ls acted");
    assert!(std::fs::read(&df).unwrap() == half, "ls over ssh wrote");
    let r = with(&me, sf.as_os_str(), &rf, &[]);
    r.ok();
    assert!(
        std::fs::read(&df).unwrap() == new,
        "push rerun corrupted it\n{r}"
    );
    assert!(find_prefixed(&dst, b".ferry-undo-").is_empty());
    // Pull: this end dies mid-patch.
    write(&back, "f", &data);
    let r = with(&me, &rf, bf.as_os_str(), &[die(literal / 2)]);
    assert!(r.code.is_none(), "not killed\n{r}");
    assert_eq!(find_prefixed(&back, b".ferry-undo-").len(), 1, "{r}");
    let r = with(&me, &rf, bf.as_os_str(), &[]);
    r.ok();
    assert!(
        std::fs::read(&bf).unwrap() == new,
        "pull rerun corrupted it\n{r}"
    );
    assert!(find_prefixed(&back, b".ferry-undo-").is_empty());
}

/// A `--delta` patch (scattered blocks and a tail) killed at every step:
/// before its first write, in the middle of one, between the blocks and
/// in the tail. Then either nothing else happens and the same command
/// again leaves the exact source bytes; or another program writes into
/// the first patched block first, and the next run reading the directory
/// keeps that program's bytes.
#[test]
fn killed_at_every_step_then_rerun_or_written_by_another() {
    let d = tmpdir();
    let (src, dst, out) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("out"),
    );
    let data = gen_bytes(4 << 20, 289);
    let (mut new, first, literal) = scattered(&data, 9, 2000);
    new.extend_from_slice(&gen_bytes(70_000, 290));
    let f = dst.join("f");
    let a: Vec<&OsStr> = vec![
        "copy".as_ref(),
        "--delta".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ];
    for at in [0, 1, 8191, 8192, literal / 2, literal - 1, literal + 30_000] {
        for other in [false, true] {
            write(&src, "f", &data);
            ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
            write(&src, "f", &new);
            let r = ferry_env(&a, &[die(at)]);
            assert!(r.code.is_none(), "not killed at {at}\n{r}");
            if !other {
                let r = ferry_env(&a, &[]);
                r.ok();
                assert!(
                    std::fs::read(&f).unwrap() == new,
                    "killed at {at}: the rerun is not exact\n{r}"
                );
            } else {
                write_at(&f, first as u64, b"ANOTHER PROGRAM");
                let theirs = std::fs::read(&f).unwrap();
                let r = ferry(["copy".as_ref(), dst.as_os_str(), out.as_os_str()]);
                assert!(
                    std::fs::read(&f).unwrap() == theirs,
                    "killed at {at}: a later write undone\n{r}"
                );
            }
            assert!(find_prefixed(&dst, b".ferry-undo-").is_empty(), "at {at}");
        }
    }
}
