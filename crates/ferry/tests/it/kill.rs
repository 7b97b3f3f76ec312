//! kill -9 at random moments: no file is ever visible at its final name half-written or
//! without its metadata, and the next run completes the job and leaves no temporaries.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::util::*;

/// What a DST entry at a final name may look like (one complete version of a SRC entry).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Version {
    File {
        size: u64,
        hash: u64,
        mtime_ns: i128,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Symlink {
        target: std::ffi::OsString,
    },
    Dir,
}

fn version(e: &Entry) -> Option<Version> {
    match e.kind {
        Kind::File => Some(Version::File {
            size: e.size,
            hash: e.hash,
            mtime_ns: e.mtime_ns,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
        }),
        Kind::Symlink => Some(Version::Symlink {
            target: e.target.clone().unwrap(),
        }),
        Kind::Dir => Some(Version::Dir),
        Kind::Other => None,
    }
}

type Allowed = BTreeMap<PathBuf, BTreeSet<Version>>;

fn add_versions(allowed: &mut Allowed, src: &Path) {
    for (k, e) in snapshot(src) {
        if k.as_os_str().is_empty() {
            continue;
        }
        if let Some(v) = version(&e) {
            allowed.entry(k).or_default().insert(v);
        }
    }
}

/// Check every DST entry at a final name against the allowed versions.
/// Returns the number of temporaries seen.
#[track_caller]
fn check_dst(dst: &Path, allowed: &Allowed, round: &str) -> usize {
    let mut problems = Vec::new();
    let mut tmps = 0;
    for (k, e) in snapshot(dst) {
        if k.as_os_str().is_empty() {
            continue;
        }
        if k.components().any(|c| {
            use std::os::unix::ffi::OsStrExt;
            c.as_os_str().as_bytes().starts_with(TMP_PREFIX)
        }) {
            tmps += 1;
            continue;
        }
        let Some(ok) = allowed.get(&k) else {
            problems.push(format!("{k:?}: exists in DST but never in SRC ({e:?})"));
            continue;
        };
        let v = version(&e);
        if !v.as_ref().is_some_and(|v| ok.contains(v)) {
            problems.push(format!("{k:?}: DST has {v:?}, allowed {ok:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "{round}: {} entries at final names are not a complete SRC version:\n{}",
        problems.len(),
        problems
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    tmps
}

fn build_src(src: &Path, rng: &mut Rng) {
    for d in 0..40 {
        let dir = format!("d{d:02}");
        let nfiles = 70;
        for f in 0..nfiles {
            let rel = if d % 5 == 0 && f % 3 == 0 {
                format!("{dir}/s/f{f:03}")
            } else {
                format!("{dir}/f{f:03}")
            };
            write_random(src, &rel, 4000, rng);
        }
        if d % 4 == 0 {
            ln(src, format!("{dir}/link"), "f001");
        }
    }
    for b in 0..6 {
        let size = rng.range(1 << 20, 8 << 20) as usize;
        write(src, format!("big/b{b}"), &gen_bytes(size, rng.next_u64()));
    }
    // Users' files named like the temporaries of older versions: synced like
    // any other file, never taken for leftovers.
    write(src, "d01/.ferry-tmp.user", b"mine");
    write(
        src,
        "d02/.ferry-tmp.part.0123456789abcdef",
        &gen_bytes(5000, 3),
    );
    stamp_tree(src, 1_500_000_000);
}

fn modify_src(src: &Path, rng: &mut Rng) {
    let t = |rng: &mut Rng| {
        (
            1_600_000_000 + rng.range(0, 1000) as i64,
            rng.range(0, 1_000_000_000) as u32,
        )
    };
    // big files: new content of the same size (and some of another size), new mtime
    for b in 0..6 {
        let p = src.join(format!("big/b{b}"));
        let len = fs::metadata(&p).unwrap().len() as usize;
        let len = if b % 2 == 0 { len } else { len + 4099 };
        fs::write(&p, gen_bytes(len, rng.next_u64())).unwrap();
        set_mtime(&p, t(rng));
    }
    let files: Vec<PathBuf> = walk(src)
        .into_iter()
        .filter(|p| p.starts_with("d") && fs::symlink_metadata(src.join(p)).unwrap().is_file())
        .collect();
    for (i, rel) in files.iter().enumerate() {
        let p = src.join(rel);
        match i % 10 {
            // new content and mtime
            0 | 1 => {
                fs::write(&p, gen_bytes(rng.range(0, 5000) as usize, rng.next_u64())).unwrap();
                set_mtime(&p, t(rng));
            }
            // mode only
            2 => {
                let mt = get_mtime(&p);
                chmod(&p, 0o600);
                set_mtime(&p, mt);
            }
            // deleted
            3 => fs::remove_file(&p).unwrap(),
            // file -> symlink
            4 if i % 20 == 4 => {
                fs::remove_file(&p).unwrap();
                std::os::unix::fs::symlink("elsewhere", &p).unwrap();
            }
            _ => {}
        }
    }
    for n in 0..200 {
        let p = write(
            src,
            format!("new{}/n{n:03}", n % 7),
            &gen_bytes(rng.range(0, 3000) as usize, rng.next_u64()),
        );
        set_mtime(&p, t(rng));
    }
    fs::remove_dir_all(src.join("d39")).unwrap();
}

/// How long an uninterrupted `sync src dst` takes (used only to spread the kill moments over
/// a run; nothing is asserted about it).
fn calibrate(src: &Path, dst: &Path, scratch: &Path, baseline: Option<&Path>) -> Duration {
    reset(scratch, baseline);
    let t0 = Instant::now();
    let r = ferry([
        std::ffi::OsStr::new("sync"),
        src.as_os_str(),
        scratch.as_os_str(),
    ]);
    let d = t0.elapsed();
    r.ok();
    assert_trees_equal(src, scratch);
    let _ = dst;
    fs::remove_dir_all(scratch).unwrap();
    d
}

fn cp_a(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        st.success(),
        "cp -a {} {} failed",
        from.display(),
        to.display()
    );
}

/// Put `dst` back into the `baseline` state (None: DST does not exist).
fn reset(dst: &Path, baseline: Option<&Path>) {
    if dst.exists() {
        fs::remove_dir_all(dst).unwrap();
    }
    if let Some(b) = baseline {
        cp_a(b, dst);
    }
}

/// Eight `ferry sync` runs killed with SIGKILL at a random moment. Even rounds start again
/// from `baseline` (so each kill lands at a fresh random point of a full run), odd rounds go
/// on from the state the previous kill left (stale temporaries, half-done tree).
/// Rounds 1 and 5 (of 0..8) run with `extra` flags.
#[allow(clippy::too_many_arguments)]
fn kill_rounds(
    src: &Path,
    dst: &Path,
    baseline: Option<&Path>,
    allowed: &Allowed,
    rng: &mut Rng,
    phase: &str,
    full: Duration,
    extra: &[&str],
) {
    let full_us = (full.as_micros() as u64).max(1000);
    let mut killed = 0;
    for i in 0..8u64 {
        if i % 2 == 0 {
            reset(dst, baseline);
        }
        let mut args = vec![std::ffi::OsStr::new("sync")];
        if i % 4 == 1 {
            args.extend(extra.iter().map(std::ffi::OsStr::new));
        }
        args.extend([src.as_os_str(), dst.as_os_str()]);
        let mut child = spawn_ferry(args);
        let delay = if i % 2 == 0 {
            rng.range(0, full_us)
        } else {
            rng.range(0, full_us / 2 + 1)
        };
        // The random moment of the kill (what the test is about), not a wait.
        sleep(Duration::from_micros(delay));
        let _ = child.kill(); // SIGKILL; may already have finished
        let status = child.wait().expect("wait");
        if status.code().is_none() {
            killed += 1;
        }
        let round = format!("{phase} round {i} ({status} after {delay} us)");
        if dst.exists() {
            let tmps = check_dst(dst, allowed, &round);
            eprintln!("{round}: ok, {tmps} stale temporaries");
        } else {
            eprintln!("{round}: DST not created yet");
        }
    }
    eprintln!("{phase}: {killed} of 8 runs killed mid-way (a full run took {full:?})");
}

#[test]
fn kill_9_never_leaves_half_written_files() {
    let t = tmpdir();
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    let mut rng = Rng::new(0x00F3_2217_9A1C);
    build_src(&src, &mut rng);

    // Phase A: fresh copy, killed again and again.
    let mut allowed = Allowed::new();
    add_versions(&mut allowed, &src);
    let scratch = t.path().join("scratch");
    let full = calibrate(&src, &dst, &scratch, None);
    kill_rounds(&src, &dst, None, &allowed, &mut rng, "A", full, &[]);
    run_on("sync", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
    assert_eq!(
        find_prefixed(&dst, TMP_PREFIX),
        Vec::<PathBuf>::new(),
        "temporaries left after a full run"
    );

    // Phase B: updates, deletions, type changes, killed again and again.
    let baseline = t.path().join("baseline");
    cp_a(&dst, &baseline);
    modify_src(&src, &mut rng);
    add_versions(&mut allowed, &src);
    let full = calibrate(&src, &dst, &scratch, Some(&baseline));
    // Some rounds delete under --max-delete (planned first, then entry by entry).
    kill_rounds(
        &src,
        &dst,
        Some(&baseline),
        &allowed,
        &mut rng,
        "B",
        full,
        &["--max-delete", "90%"],
    );
    run_on("sync", &src, &dst, &[]).ok();
    assert_trees_equal(&src, &dst);
    assert_eq!(
        find_prefixed(&dst, TMP_PREFIX),
        Vec::<PathBuf>::new(),
        "temporaries left after a full run"
    );

    // Phase C: with --fsync, killed, then completed.
    write(&src, "big/b0", &gen_bytes(3 << 20, 77));
    set_mtime(&src.join("big/b0"), (1_700_000_000, 1));
    add_versions(&mut allowed, &src);
    for i in 0..3u64 {
        let mut child = spawn_ferry([
            std::ffi::OsStr::new("sync"),
            std::ffi::OsStr::new("--fsync"),
            src.as_os_str(),
            dst.as_os_str(),
        ]);
        // The random moment of the kill (what the test is about), not a wait.
        sleep(Duration::from_millis(rng.range(0, 50 + i * 100)));
        let _ = child.kill();
        let _ = child.wait();
        check_dst(&dst, &allowed, &format!("C round {i}"));
    }
    run_on("sync", &src, &dst, &["--fsync"]).ok();
    assert_trees_equal(&src, &dst);
    assert_eq!(
        find_prefixed(&dst, TMP_PREFIX),
        Vec::<PathBuf>::new(),
        "temporaries left after a full run"
    );
}
