//! A destination disk that fills up mid-run (issue 14's "remote disk full", issue 15's
//! append in place): each file that does not fit fails with one line naming it and the
//! cause, the rest are copied, the run exits 1, nothing half-written sits under a final
//! name, no temporary or rollback record is left, and once there is room a rerun completes.
//!
//! The full disk is a small tmpfs mounted for the test (root only: the tests skip with a
//! line saying so where `mount` is not allowed). Locally, over ssh (`ferry serve` writing)
//! and over SFTP (OpenSSH's sftp-server writing).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::ssh::{ssh_at, ssh_server};
use crate::util::*;

/// A tmpfs of a given size mounted on a fresh directory; unmounted when dropped.
struct Tmpfs {
    _dir: tempfile::TempDir,
    at: PathBuf,
}

impl Tmpfs {
    fn mount(kib: u64) -> Result<Tmpfs, String> {
        Tmpfs::mount_with(&format!("size={kib}k,mode=755"))
    }

    /// With mount options `opts`.
    fn mount_with(opts: &str) -> Result<Tmpfs, String> {
        let dir = tmpdir();
        let at = dir.path().join("fs");
        std::fs::create_dir(&at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(opts)
            .arg("tmpfs")
            .arg(&at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot mount a tmpfs here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { _dir: dir, at })
    }

    /// Give it room: `kib` KiB in all.
    fn grow(&self, kib: u64) {
        let st = Command::new("mount")
            .args(["-o"])
            .arg(format!("remount,size={kib}k"))
            .arg(&self.at)
            .status()
            .unwrap();
        assert!(st.success(), "remount {}", self.at.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Six files of 600,000 bytes (3.6 MB): a 2,600 KiB tmpfs holds four at most.
fn six_files(root: &Path) {
    for i in 0..6u64 {
        write(root, format!("d/f{i}"), &gen_bytes(600_000, i + 1));
    }
}

/// ferry `args`, with the environment `env` added.
fn ferry_env(args: &[OsString], env: &[(&str, String)]) -> Run {
    let mut c = Command::new(bin());
    c.args(args).stdin(std::process::Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    run_within(c, Duration::from_secs(600))
}

/// Names under `root` that only ferry makes (temporaries, rollback records).
fn leftovers(root: &Path) -> Vec<PathBuf> {
    find_prefixed(root, b".ferry-")
}

/// The first run into a disk too small for all: exit 1, one line per file that failed
/// naming it and "No space left", every file that is there equal to its source.
fn check_full_run(r: &Run, src: &Path, dst: &Path) {
    r.code_is(1);
    let lines = r.error_lines();
    let failed: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("no space left on device: needs "))
        .collect();
    assert!(!failed.is_empty(), "no disk-full line\n{r}");
    for l in &failed {
        assert!(
            (0..6).any(|i| l.contains(&format!("f{i}"))),
            "the line names no file: {l}\n{r}"
        );
        assert_eq!(l.lines().count(), 1);
    }
    let there: Vec<PathBuf> = walk(dst)
        .into_iter()
        .filter(|p| dst.join(p).is_file())
        .collect();
    assert_eq!(
        there.len() + failed.len(),
        6,
        "each file copied or reported once\n{r}"
    );
    for p in &there {
        assert_eq!(
            std::fs::read(dst.join(p)).unwrap(),
            std::fs::read(src.join(p)).unwrap(),
            "{} half-written under its name",
            p.display()
        );
    }
    assert_eq!(leftovers(dst), Vec::<PathBuf>::new(), "{r}");
}

/// Local to a full disk, then again with room.
#[test]
fn local_disk_full_one_line_per_file_then_rerun_completes() {
    let fs = need!(Tmpfs::mount(2600));
    let d = tmpdir();
    let src = d.path().join("src");
    six_files(&src);
    let dst = fs.at.join("dst");
    let r = ferry([OsStr::new("sync"), src.as_os_str(), dst.as_os_str()]);
    check_full_run(&r, &src, &dst);
    fs.grow(8192);
    ferry([OsStr::new("sync"), src.as_os_str(), dst.as_os_str()]).ok();
    assert_trees_equal(&src, &dst);
    assert_eq!(leftovers(&dst), Vec::<PathBuf>::new());
}

/// Pushed over ssh: the remote `ferry serve` runs out of room.
#[test]
fn remote_disk_full_over_ssh_then_rerun_completes() {
    let (rsh, host) = need!(ssh_server());
    let fs = need!(Tmpfs::mount(2600));
    let d = tmpdir();
    let src = d.path().join("src");
    six_files(&src);
    let dst = fs.at.join("dst");
    let push = [
        OsString::from("sync"),
        "-e".into(),
        rsh.clone().into(),
        "--remote-ferry".into(),
        bin(),
        src.clone().into(),
        ssh_at(&host, &dst),
    ];
    let r = ferry(&push);
    check_full_run(&r, &src, &dst);
    fs.grow(8192);
    ferry(&push).ok();
    assert_trees_equal(&src, &dst);
    assert_eq!(leftovers(&dst), Vec::<PathBuf>::new());
}

/// Pushed over SFTP (`--sftp`): OpenSSH's sftp-server runs out of room.
#[test]
fn remote_disk_full_over_sftp_then_rerun_completes() {
    let (rsh, host) = need!(ssh_server());
    let fs = need!(Tmpfs::mount(2600));
    let d = tmpdir();
    let src = d.path().join("src");
    six_files(&src);
    let dst = fs.at.join("dst");
    let push = [
        OsString::from("sync"),
        "--sftp".into(),
        "-e".into(),
        rsh.clone().into(),
        src.clone().into(),
        ssh_at(&host, &dst),
    ];
    let r = ferry(&push);
    check_full_run(&r, &src, &dst);
    fs.grow(8192);
    ferry(&push).ok();
    // SFTP keeps whole-second mtimes: compare content and names.
    for p in walk(&src) {
        let (a, b) = (src.join(&p), dst.join(&p));
        if a.is_file() {
            assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        }
    }
    assert_eq!(leftovers(&dst), Vec::<PathBuf>::new());
}

/// A big file appended to in place (`--delta`, the append threshold lowered) whose tail
/// does not fit: the append is rolled back (old bytes, old size, old mtime), the file then
/// fails whole with one line, exit 1, no rollback record or temporary left; with room, the
/// rerun appends and completes.
fn append_disk_full(remote: Option<(String, String)>) {
    let fs = need!(Tmpfs::mount(2600));
    let d = tmpdir();
    let src = d.path().join("src");
    let old = gen_bytes(1_500_000, 7);
    let mut new = old.clone();
    new.extend_from_slice(&gen_bytes(1_600_000, 8));
    let dst = fs.at.join("dst");
    write(&dst, "big", &old);
    set_mtime(&dst.join("big"), (1_700_000_000, 0));
    write(&src, "big", &new);
    let env = [("FERRY_TEST_APPEND_MIN", (1u64 << 20).to_string())];
    let mut args: Vec<OsString> = vec!["copy".into(), "--json".into()];
    let to = match &remote {
        Some((rsh, host)) => {
            args.extend(["-e".into(), rsh.into(), "--remote-ferry".into(), bin()]);
            ssh_at(host, &dst)
        }
        None => {
            args.push("--delta".into());
            dst.clone().into()
        }
    };
    args.extend([src.clone().into(), to]);
    let r = ferry_env(&args, &env);
    r.code_is(1);
    let lines = r.error_lines();
    assert_eq!(lines.len(), 1, "{r}");
    assert!(
        lines[0].contains("big") && lines[0].contains("no space left on device: needs "),
        "{r}"
    );
    assert_eq!(std::fs::read(dst.join("big")).unwrap(), old, "{r}");
    assert_eq!(get_mtime(&dst.join("big")), (1_700_000_000, 0), "{r}");
    assert_eq!(leftovers(&dst), Vec::<PathBuf>::new(), "{r}");
    fs.grow(8192);
    let r = ferry_env(&args, &env);
    r.ok();
    assert_eq!(std::fs::read(dst.join("big")).unwrap(), new, "{r}");
    assert_eq!(leftovers(&dst), Vec::<PathBuf>::new(), "{r}");
}

#[test]
fn local_append_in_place_disk_full_rolls_back() {
    append_disk_full(None);
}

#[test]
fn remote_append_in_place_disk_full_rolls_back() {
    let s = need!(ssh_server());
    append_disk_full(Some(s));
}

/// How a big file goes into the small disk.
#[derive(Clone, Copy, Debug)]
enum Way {
    Local,
    SshPush,
    SshPull,
    SftpPush,
    SftpPull,
}

/// A file bigger than the whole disk it goes to (128 MiB into 24 MiB:
/// resumable partials are made from 32 MiB up): the run fails with one
/// line naming the side, the file, what it needs and what is free; no
/// partial is left filling the disk (it could never complete there), so
/// the next sync of what fits (16 MB) succeeds.
fn bigger_than_the_disk(way: Way) {
    let ssh = match way {
        Way::Local => None,
        _ => Some(need!(ssh_server())),
    };
    let fs = need!(Tmpfs::mount(24 << 10));
    let d = tmpdir();
    let src = d.path().join("src");
    write(&src, "big", &gen_bytes(128 << 20, 5));
    let small = d.path().join("small");
    for i in 0..4u64 {
        write(&small, format!("s{i}"), &gen_bytes(4_000_000, 10 + i));
    }
    let dst = fs.at.join("dst");
    let args = |from: &Path, to: &Path| -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["sync".into()];
        let Some((rsh, host)) = &ssh else {
            a.extend([from.into(), to.into()]);
            return a;
        };
        a.extend(["-e".into(), rsh.into()]);
        match way {
            Way::SftpPush | Way::SftpPull => a.push("--sftp".into()),
            _ => a.extend(["--remote-ferry".into(), bin()]),
        }
        match way {
            Way::SshPush | Way::SftpPush => a.extend([from.into(), ssh_at(host, to)]),
            _ => a.extend([ssh_at(host, from), to.into()]),
        }
        a
    };
    let r = ferry(args(&src, &dst));
    r.code_is(1);
    let lines = r.error_lines();
    assert_eq!(lines.len(), 1, "{way:?}\n{r}");
    let l = &lines[0];
    for want in [
        "DST: big: ",
        "no space left on device: needs 128.0 MiB (134217728 bytes), ",
        " free",
    ] {
        assert!(l.contains(want), "{way:?}: want {want:?}\n{r}");
    }
    assert!(!l.contains("Failure"), "{way:?}\n{r}");
    assert_eq!(leftovers(&dst), Vec::<PathBuf>::new(), "{way:?}\n{r}");
    // What fits goes: the disk is not kept full.
    let r = ferry(args(&small, &fs.at.join("small")));
    r.ok();
    for i in 0..4 {
        let p = format!("s{i}");
        assert_eq!(
            std::fs::read(fs.at.join("small").join(&p)).unwrap(),
            std::fs::read(small.join(&p)).unwrap()
        );
    }
}

#[test]
fn local_file_bigger_than_the_disk_leaves_no_partial() {
    bigger_than_the_disk(Way::Local);
}

#[test]
fn ssh_push_bigger_than_the_disk_leaves_no_partial() {
    bigger_than_the_disk(Way::SshPush);
}

#[test]
fn ssh_pull_bigger_than_the_disk_leaves_no_partial() {
    bigger_than_the_disk(Way::SshPull);
}

#[test]
fn sftp_push_bigger_than_the_disk_leaves_no_partial() {
    bigger_than_the_disk(Way::SftpPush);
}

#[test]
fn sftp_pull_bigger_than_the_disk_leaves_no_partial() {
    bigger_than_the_disk(Way::SftpPull);
}

/// Many small files pushed over SFTP into a disk that holds a few: each
/// one that fails says the disk is full and what it needs (never only
/// the server's "Failure", SFTP's one code for every cause), the others
/// are copied whole.
#[test]
fn sftp_small_files_on_a_full_disk_say_so() {
    let (rsh, host) = need!(ssh_server());
    let fs = need!(Tmpfs::mount(512));
    let d = tmpdir();
    let src = d.path().join("src");
    for i in 0..60u64 {
        write(&src, format!("f{i:02}"), &gen_bytes(16_000, 100 + i));
    }
    let dst = fs.at.join("dst");
    let push = [
        OsString::from("sync"),
        "--sftp".into(),
        "-e".into(),
        rsh.into(),
        src.clone().into(),
        ssh_at(&host, &dst),
    ];
    let r = ferry(&push);
    r.code_is(1);
    let lines = r.error_lines();
    assert!(!lines.is_empty(), "{r}");
    for l in &lines {
        assert!(!l.contains("Failure"), "{r}");
        assert!(
            l.starts_with("ferry: DST: f")
                && l.contains(": write: no space left on device: needs 15.6 KiB (16000 bytes), "),
            "{r}"
        );
    }
    let there = walk(&dst)
        .into_iter()
        .filter(|p| dst.join(p).is_file())
        .count();
    assert_eq!(there + lines.len(), 60, "{r}");
    assert_eq!(leftovers(&dst), Vec::<PathBuf>::new(), "{r}");
}

/// A disk out of inodes, not bytes: each file that did not fit says it
/// needs an inode and none is free.
#[test]
fn local_inodes_out_say_so() {
    let fs = need!(Tmpfs::mount_with("size=8m,nr_inodes=8,mode=755"));
    let d = tmpdir();
    let src = d.path().join("src");
    for i in 0..12u64 {
        write(&src, format!("f{i:02}"), b"ab");
    }
    let dst = fs.at.join("dst");
    let r = ferry([OsStr::new("copy"), src.as_os_str(), dst.as_os_str()]);
    r.code_is(1);
    let lines = r.error_lines();
    assert!(!lines.is_empty(), "{r}");
    for l in &lines {
        assert!(
            l.starts_with("ferry: DST: f")
                && l.ends_with(
                    ": write: no space left on device: needs an inode and 2 bytes, no inode free"
                ),
            "{r}"
        );
    }
    assert_eq!(leftovers(&dst), Vec::<PathBuf>::new(), "{r}");
}
