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
        let dir = tmpdir();
        let at = dir.path().join("fs");
        std::fs::create_dir(&at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={kib}k,mode=755"))
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
        .filter(|l| l.contains("No space left on device"))
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
        lines[0].contains("big") && lines[0].contains("No space left on device"),
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
