//! Hostile tests: watch_roots (see main.rs). A watched root that vanishes
//! or is swapped while a watch runs (a tmpfs unmounted, `rm -rf`, renamed
//! away and replaced by an empty directory, by a directory with a file, by
//! a symlink) never makes a run delete on the other side; `--max-delete`
//! holds for the runs of what changed; a writer at random moments loses
//! nothing. Every wait polls for a condition (no sleep synchronises).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::watch::{converge, Watch, WAIT};
use crate::util::*;

/// A tmpfs mounted on `at` (a fresh directory); unmounted (lazily) when
/// dropped if the test did not unmount it.
struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    fn mount(at: &Path) -> Result<Tmpfs, String> {
        fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m,mode=755", "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot mount a tmpfs here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            at: at.to_path_buf(),
        })
    }

    /// `umount` (not lazy), retried until it goes through: a run in flight
    /// may hold a directory of it open for a moment.
    fn umount(&self) {
        let end = Instant::now() + WAIT;
        loop {
            let out = Command::new("umount").arg(&self.at).output().unwrap();
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < end,
                "umount {}: {}",
                self.at.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).output();
    }
}

/// `n` small files `DIR/fI` under `root`, each with its own bytes.
fn fill(root: &Path, dir: &str, n: usize) {
    for i in 0..n {
        write(
            root,
            format!("{dir}/f{i}"),
            format!("{dir} {i}\n").as_bytes(),
        );
    }
}

/// Files (and symlinks) under `root` with their inode numbers: a file
/// deleted and copied again gets another.
fn inodes(root: &Path) -> BTreeMap<PathBuf, u64> {
    walk(root)
        .into_iter()
        .filter_map(|p| {
            let m = fs::symlink_metadata(root.join(&p)).ok()?;
            (!m.is_dir()).then_some((p, m.ino()))
        })
        .collect()
}

/// Every file of `before` is still in `dst`, the same file (inode).
#[track_caller]
fn all_kept(before: &BTreeMap<PathBuf, u64>, dst: &Path, w: &mut Watch) {
    let now = inodes(dst);
    let lost: Vec<String> = before
        .iter()
        .filter(|(p, ino)| now.get(*p) != Some(ino))
        .map(|(p, _)| match now.get(p) {
            None => format!("{} (deleted)", p.display()),
            Some(_) => format!("{} (replaced)", p.display()),
        })
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} files deleted or replaced in DST: {:?}...\nferry stderr:\n{}",
        lost.len(),
        before.len(),
        &lost[..lost.len().min(5)],
        w.stderr()
    );
}

/// Wait until `n` runs were refused or failed as a whole (each says so
/// with `(watching on)`).
#[track_caller]
fn refusals(w: &mut Watch, n: usize) -> String {
    w.nth_line_with("(watching on)", n)
}

/// (a) A tmpfs SRC unmounted while watched leaves its empty mount point:
/// the full run after it is refused, and so is the scoped run of the next
/// event there (`echo x > src/app.lock`): it used to delete all 200 files
/// of DST without `--force`.
#[test]
fn an_unmounted_source_deletes_nothing_in_dst() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let fs_ = need!(Tmpfs::mount(&src));
    for d in ["a", "b", "c", "d"] {
        fill(&src, d, 50);
    }
    let mut w = Watch::start(&["sync"], &src, &dst);
    converge(&src, &dst, &mut w);
    let before = inodes(&dst);
    assert_eq!(before.len(), 200);
    fs_.umount();
    let first = refusals(&mut w, 1);
    assert!(
        first.contains("SRC is not the directory watched"),
        "{first}"
    );
    fs::write(src.join("app.lock"), b"x\n").unwrap();
    let second = refusals(&mut w, 2);
    assert!(
        second.contains("SRC is not the directory watched"),
        "{second}"
    );
    all_kept(&before, &dst, &mut w);
    assert!(!dst.join("app.lock").exists(), "nothing is synced from it");
    w.stop_ok();
}

/// (b) `rm -rf SRC` while watched, 600 files: the removals inside are held
/// until they are quiet, by then the root is gone: nothing is deleted in
/// DST (it used to lose 426-479 of them). A new empty SRC made there
/// afterwards is another directory: refused too.
#[test]
fn rm_rf_of_the_source_deletes_nothing_in_dst() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    for i in 0..6 {
        fill(&src, &format!("d{i}/sub"), 100);
    }
    let mut w = Watch::start(&["sync"], &src, &dst);
    converge(&src, &dst, &mut w);
    let before = inodes(&dst);
    assert_eq!(before.len(), 600);
    let st = Command::new("rm").arg("-rf").arg(&src).status().unwrap();
    assert!(st.success());
    w.line_with("a watched root is gone");
    // Back, as another (empty) directory: its full run is refused.
    fs::create_dir(&src).unwrap();
    refusals(&mut w, 1);
    all_kept(&before, &dst, &mut w);
    w.stop_ok();
}

/// (c) `--max-delete 10` holds for the runs of what changed: `rm -rf` of
/// two directories of 200 files each is refused (all 400 used to go); a
/// single removal afterwards is still mirrored.
#[test]
fn max_delete_holds_for_scoped_runs() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fill(&src, "a", 200);
    fill(&src, "b", 200);
    fill(&src, "c", 3);
    let mut w = Watch::start(&["sync", "--max-delete", "10"], &src, &dst);
    converge(&src, &dst, &mut w);
    let before = inodes(&dst);
    let st = Command::new("rm")
        .arg("-rf")
        .arg(src.join("a"))
        .arg(src.join("b"))
        .status()
        .unwrap();
    assert!(st.success());
    let line = refusals(&mut w, 1);
    assert!(line.contains("refusing to delete"), "{line}");
    all_kept(&before, &dst, &mut w);
    // Within the limit: mirrored.
    fs::remove_file(src.join("c/f0")).unwrap();
    w.until("c/f0 not deleted in DST", || !dst.join("c/f0").exists());
    let now = inodes(&dst);
    assert_eq!(now.len(), before.len() - 1, "only c/f0 deleted");
    w.stop_ok();
}

/// The window: the removals of earlier runs count. Eight removals, then
/// eight more with `--max-delete 10`: the second batch is refused.
#[test]
fn max_delete_counts_the_removals_of_earlier_runs() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fill(&src, "a", 8);
    fill(&src, "b", 8);
    fill(&src, "c", 1);
    let mut w = Watch::start(&["sync", "--max-delete", "10"], &src, &dst);
    converge(&src, &dst, &mut w);
    fs::remove_dir_all(src.join("a")).unwrap();
    w.until("a not deleted in DST", || !dst.join("a").exists());
    let before = inodes(&dst);
    fs::remove_dir_all(src.join("b")).unwrap();
    let line = refusals(&mut w, 1);
    assert!(line.contains("removed by this watch's runs"), "{line}");
    all_kept(&before, &dst, &mut w);
    w.stop_ok();
}

/// SRC renamed away and replaced by an empty directory, a directory with a
/// file, or a symlink to one: no run deletes anything in DST, and the
/// original put back is synced again.
#[test]
fn a_swapped_source_deletes_nothing_in_dst() {
    for how in ["empty", "one file", "symlink"] {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        fill(&src, "d", 30);
        let mut w = Watch::start(&["sync"], &src, &dst);
        converge(&src, &dst, &mut w);
        let before = inodes(&dst);
        let aside = t.path().join("aside");
        fs::rename(&src, &aside).unwrap();
        w.line_with("a watched root is gone");
        let other = t.path().join("other");
        fs::create_dir(&other).unwrap();
        if how != "empty" {
            write(&other, "x", b"x");
        }
        if how == "symlink" {
            symlink(&other, &src).unwrap();
        } else {
            fs::rename(&other, &src).unwrap();
            refusals(&mut w, 1);
            write(&src, "later", b"later");
            refusals(&mut w, 2);
        }
        all_kept(&before, &dst, &mut w);
        // The original back: synced, nothing of it lost.
        if how == "symlink" {
            fs::remove_file(&src).unwrap();
        } else {
            fs::rename(&src, &other).unwrap();
        }
        write(&aside, "h", b"h");
        fs::rename(&aside, &src).unwrap();
        converge(&src, &dst, &mut w);
        all_kept(&before, &dst, &mut w);
        w.stop_ok();
    }
}

/// `bisync --watch`: side A, a tmpfs, unmounted while watched, then a file
/// made in its empty mount point: B keeps all it had (with `--max-delete
/// 100` nothing else would have stopped it).
#[test]
fn bisync_an_unmounted_side_deletes_nothing_on_the_other() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let fs_ = need!(Tmpfs::mount(&a));
    fs::create_dir(&b).unwrap();
    fill(&a, "d", 100);
    let journal = t.path().join("j.sqlite");
    let mut cmd = Command::new(bin());
    cmd.args(["bisync", "--watch", "--max-delete", "100", "--journal"])
        .arg(&journal)
        .arg(&a)
        .arg(&b);
    let mut w = Watch::spawn(cmd);
    w.until("not synced", || inodes(&b).len() == 100);
    let before = inodes(&b);
    fs_.umount();
    let line = refusals(&mut w, 1);
    assert!(line.contains("is not the directory watched"), "{line}");
    // The next change there is refused too.
    fs::write(a.join("app.lock"), b"x\n").unwrap();
    refusals(&mut w, 2);
    all_kept(&before, &b, &mut w);
    assert!(!b.join("app.lock").exists());
    w.stop_ok();
}

/// `bisync --watch`: `rm -rf` of side A, 300 files: nothing deleted on B.
#[test]
fn bisync_rm_rf_of_a_side_deletes_nothing_on_the_other() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    fs::create_dir(&b).unwrap();
    for i in 0..3 {
        fill(&a, &format!("d{i}"), 100);
    }
    let journal = t.path().join("j.sqlite");
    let mut cmd = Command::new(bin());
    cmd.args(["bisync", "--watch", "--max-delete", "100", "--journal"])
        .arg(&journal)
        .arg(&a)
        .arg(&b);
    let mut w = Watch::spawn(cmd);
    w.until("not synced", || inodes(&b).len() == 300);
    let before = inodes(&b);
    let st = Command::new("rm").arg("-rf").arg(&a).status().unwrap();
    assert!(st.success());
    w.line_with("a watched root is gone");
    fs::create_dir(&a).unwrap();
    refusals(&mut w, 1);
    all_kept(&before, &b, &mut w);
    w.stop_ok();
}

/// DST renamed away and replaced by an empty directory: the next run is
/// refused (nothing is written into the new one), and the old one keeps
/// every file.
#[test]
fn a_swapped_destination_is_refused() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fill(&src, "d", 20);
    let mut w = Watch::start(&["sync"], &src, &dst);
    converge(&src, &dst, &mut w);
    let aside = t.path().join("dst.old");
    let before = inodes(&dst);
    fs::rename(&dst, &aside).unwrap();
    fs::create_dir(&dst).unwrap();
    write(&src, "new", b"new");
    let line = refusals(&mut w, 1);
    assert!(line.contains("DST is not the directory watched"), "{line}");
    assert!(walk(&dst).is_empty(), "nothing written into the new DST");
    all_kept(&before, &aside, &mut w);
    w.stop_ok();
}

/// With `--force`, a root replaced by another directory is adopted (one
/// note says so) and synced as it is: the rule `--force` states.
#[test]
fn force_adopts_a_swapped_source() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fill(&src, "d", 5);
    let mut w = Watch::start(&["sync", "--force"], &src, &dst);
    converge(&src, &dst, &mut w);
    fs::rename(&src, t.path().join("aside")).unwrap();
    w.line_with("a watched root is gone");
    let other = t.path().join("other");
    write(&other, "x", b"x");
    fs::rename(&other, &src).unwrap();
    w.line_with("SRC is another directory than the one watched");
    converge(&src, &dst, &mut w);
    w.stop_ok();
}
