//! Kept versions (`--versions`): `ferry versions`, `ferry restore`, and the
//! pruning of versions after a run by the retention policy, with the clock
//! injected (`FERRY_TEST_NOW`). Versions are made by hand in
//! `.ferry-versions`, named as the engine names them.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::util::*;
use ferry_engine::keep::{stamp, version_name};

/// 2026-11-25 16:33:43 UTC.
const NOW: i64 = 1_795_624_423;
const HOUR: i64 = 3600;
const DAY: i64 = 86_400;

/// `ferry ARGS` with the clock at `NOW`, local time UTC.
fn at_now<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    at_time(NOW, args)
}

/// `ferry ARGS` with the clock at `t`, local time UTC.
fn at_time<S: AsRef<std::ffi::OsStr>>(t: i64, args: &[S]) -> Run {
    let mut c = Command::new(bin());
    c.args(args)
        .env("FERRY_TEST_NOW", t.to_string())
        .env("TZ", "UTC");
    run_within(c, std::time::Duration::from_secs(600))
}

/// The name of the version of `rel`'s file kept at `t`.
fn vname(rel: &str, t: i64) -> String {
    let name = rel.rsplit('/').next().unwrap();
    String::from_utf8(version_name(name.as_bytes(), &stamp(t), 1)).unwrap()
}

/// Keep a version of `rel` (below `root`) kept at `t`, holding `data`,
/// with mtime `t - 60`; returns its path.
fn version(root: &Path, rel: &str, t: i64, data: &[u8]) -> std::path::PathBuf {
    let dir = match rel.rsplit_once('/') {
        Some((d, _)) => format!(".ferry-versions/{d}"),
        None => ".ferry-versions".to_string(),
    };
    let p = write(root, format!("{dir}/{}", vname(rel, t)), data);
    set_mtime(&p, (t - 60, 0));
    p
}

/// Names in a directory, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn lists_versions_newest_first() {
    let t = tmpdir();
    let r = t.path().join("r");
    write(&r, "d/f.txt", b"now");
    version(&r, "d/f.txt", NOW - 2 * HOUR, b"older");
    version(&r, "d/f.txt", NOW - HOUR, b"newer!");
    version(&r, "d/gone.txt", NOW - DAY, b"deleted");
    write(&r, ".ferry-versions/d/not-a-version.txt", b"x");

    set_mtime(&r.join("d/f.txt"), (NOW - 30 * 60, 0));
    let run = at_now(&["versions".as_ref(), r.join("d/f.txt").as_os_str()]);
    run.ok();
    let lines: Vec<String> = run.out().lines().map(str::to_owned).collect();
    // A header, the current file, then each version with the span it
    // held: written (its mtime), replaced (its keep time).
    assert_eq!(lines.len(), 4, "{run}");
    let cols: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(cols, ["WRITTEN", "REPLACED", "SIZE", "VERSION"], "{run}");
    assert!(
        lines[1].starts_with("2026-11-25 16:03:43  (current)  "),
        "{run}"
    );
    assert!(
        lines[2].starts_with("2026-11-25 15:32:43  2026-11-25 15:33:43     6  "),
        "{run}"
    );
    assert!(
        lines[2].ends_with(&format!(
            "{}/.ferry-versions/d/{}",
            r.canonicalize().unwrap().display(),
            vname("f.txt", NOW - HOUR)
        )),
        "{run}"
    );
    assert!(
        lines[3].starts_with("2026-11-25 14:32:43  2026-11-25 14:33:43"),
        "{run}"
    );
    // Local time: the same versions an hour later in UTC+1.
    let mut c = Command::new(bin());
    c.args(["versions".as_ref(), r.join("d/f.txt").as_os_str()])
        .env("FERRY_TEST_NOW", NOW.to_string())
        .env("TZ", "UTC-1");
    let run = run_within(c, std::time::Duration::from_secs(600));
    assert!(
        run.ok()
            .out()
            .lines()
            .nth(2)
            .unwrap()
            .starts_with("2026-11-25 16:32:43  2026-11-25 16:33:43"),
        "{run}"
    );

    // A deleted file, from a subdirectory of the replica as the working
    // directory's relative path.
    let mut c = Command::new(bin());
    c.args(["versions", "--json", "gone.txt"])
        .current_dir(r.join("d"))
        .env("FERRY_TEST_NOW", NOW.to_string());
    // JSON times are UTC whatever the zone.
    c.env("TZ", "UTC-5");
    let run = run_within(c, std::time::Duration::from_secs(600));
    run.ok();
    let v: serde_json::Value = serde_json::from_str(run.out().trim()).unwrap();
    assert_eq!(v["path"], "d/gone.txt");
    assert_eq!(v["kept"], "2026-11-24T16:33:43Z");
    assert_eq!(v["written"], "2026-11-24T16:32:43Z");
    assert_eq!(v["deleted"], true);
    assert_eq!(v["size"], 7);

    // A directory: each file with versions, once, deleted ones marked.
    let run = at_now(&["versions".as_ref(), r.as_os_str()]);
    run.ok();
    let out = run.out();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{run}");
    assert_eq!(
        lines[0]
            .split("  ")
            .filter(|c| !c.is_empty())
            .map(str::trim)
            .collect::<Vec<_>>(),
        ["LAST REPLACED", "VERSIONS", "NOW", "PATH"],
        "{run}"
    );
    assert!(
        lines[1].contains("  2  present  ") && lines[1].ends_with("d/f.txt"),
        "{run}"
    );
    assert!(
        lines[2].contains("  1  deleted  ") && lines[2].ends_with("d/gone.txt"),
        "{run}"
    );
    // --json: one object per version.
    let run = at_now(&[
        "versions".as_ref(),
        "--json".as_ref(),
        r.join("d").as_os_str(),
    ]);
    assert_eq!(run.ok().out().lines().count(), 3, "{run}");
}

#[test]
fn unknown_paths_exit_2_and_no_versions_exit_0() {
    let t = tmpdir();
    let plain = t.path().join("plain");
    write(&plain, "f", b"x");
    let run = at_now(&["versions".as_ref(), plain.join("f").as_os_str()]);
    run.code_is(2);
    assert!(run.err().contains("no .ferry-versions directory"), "{run}");
    let run = at_now(&["restore".as_ref(), plain.join("f").as_os_str()]);
    run.code_is(2);

    let r = t.path().join("r");
    write(&r, "f", b"x");
    fs::create_dir_all(r.join(".ferry-versions")).unwrap();
    let run = at_now(&["versions".as_ref(), r.join("f").as_os_str()]);
    run.ok();
    assert!(
        run.out().is_empty() && run.err().contains("no versions"),
        "{run}"
    );
    let run = at_now(&["versions".as_ref(), r.join("nothing").as_os_str()]);
    run.code_is(2);
    assert_eq!(run.error_lines().len(), 1, "{run}");
    let run = at_now(&["restore".as_ref(), r.join("f").as_os_str()]);
    run.code_is(2);
    assert!(run.err().contains("no versions kept"), "{run}");
    assert_eq!(fs::read(r.join("f")).unwrap(), b"x");
    // The versions directory itself is no file with versions.
    write(&r, ".ferry-versions/f~20261124-163343", b"v");
    for cmd in ["versions", "restore"] {
        let run = at_now(&[
            cmd.as_ref(),
            r.join(".ferry-versions/f~20261124-163343").as_os_str(),
        ]);
        run.code_is(2);
        assert!(run.err().contains("inside .ferry-versions"), "{run}");
    }
}

#[test]
fn restore_puts_back_the_newest_of_a_deleted_file() {
    let t = tmpdir();
    let r = t.path().join("r");
    version(&r, "a/b/f.txt", NOW - 2 * DAY, b"first");
    let newest = version(&r, "a/b/f.txt", NOW - DAY, b"second");
    fs::set_permissions(&newest, fs::Permissions::from_mode(0o640)).unwrap();

    // -n: nothing changes.
    let run = at_now(&[
        "restore".as_ref(),
        "-n".as_ref(),
        r.join("a/b/f.txt").as_os_str(),
    ]);
    assert!(run.ok().out().starts_with("would restore"), "{run}");
    assert!(!r.join("a").exists());

    let run = at_now(&["restore".as_ref(), r.join("a/b/f.txt").as_os_str()]);
    run.ok();
    assert!(run.out().starts_with("restored "), "{run}");
    assert_eq!(run.out().lines().count(), 1, "{run}");
    let f = r.join("a/b/f.txt");
    assert_eq!(fs::read(&f).unwrap(), b"second");
    assert_eq!(get_mtime(&f), (NOW - DAY - 60, 0));
    assert_eq!(
        fs::metadata(&f).unwrap().permissions().mode() & 0o7777,
        0o640
    );
    // Copied, not moved: the history is whole.
    assert_eq!(fs::read(&newest).unwrap(), b"second");
    assert_eq!(names(&r.join(".ferry-versions/a/b")).len(), 2);
}

/// `ferry sync --versions SRC DST` with the clock at `t`.
fn sync_at(t: i64, src: &Path, dst: &Path) {
    at_time(
        t,
        &[
            "sync".as_ref(),
            "--versions".as_ref(),
            src.as_os_str(),
            dst.as_os_str(),
        ],
    )
    .ok();
}

/// `restore --at WHEN PATH [extra]` with the clock at NOW.
fn restore_at(when: &str, path: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<OsString> = vec!["restore".into(), "--at".into(), when.into()];
    args.extend(extra.iter().map(OsString::from));
    args.push(path.as_os_str().to_owned());
    at_now(&args)
}

/// `YYYY-MM-DD HH:MM:SS` (UTC, the tests' local time) of Unix seconds.
fn civil(t: i64) -> String {
    let s = stamp(t);
    format!(
        "{}-{}-{} {}:{}:{}",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15]
    )
}

/// The history of the issue: a file written, synced, rewritten between
/// nightly syncs. `f`: A written at NOW-3d, B at NOW-2d-1h, synced at
/// NOW-2d (A kept), C at NOW-1d-1h, synced at NOW-1d (B kept). `g`:
/// written at NOW-3d, deleted and synced at NOW-2d, made anew at
/// NOW-1d-1h.
fn nightly(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (src, dst) = (t.join("src"), t.join("dst"));
    write(&src, "f", b"A");
    set_mtime(&src.join("f"), (NOW - 3 * DAY, 0));
    write(&src, "g", b"g1");
    set_mtime(&src.join("g"), (NOW - 3 * DAY, 0));
    sync_at(NOW - 3 * DAY + HOUR, &src, &dst);
    write(&src, "f", b"B");
    set_mtime(&src.join("f"), (NOW - 2 * DAY - HOUR, 0));
    fs::remove_file(src.join("g")).unwrap();
    sync_at(NOW - 2 * DAY, &src, &dst);
    write(&src, "f", b"C");
    set_mtime(&src.join("f"), (NOW - DAY - HOUR, 0));
    write(&src, "g", b"g2");
    set_mtime(&src.join("g"), (NOW - DAY - HOUR, 0));
    sync_at(NOW - DAY, &src, &dst);
    (src, dst)
}

#[test]
fn restore_at_gives_what_the_file_held_then() {
    let t = tmpdir();
    let (_src, dst) = nightly(t.path());
    let f = dst.join("f");
    let cases: [(String, &[u8]); 8] = [
        // Right after it was first written, before any sync kept a
        // version: A (was "no version kept").
        (civil(NOW - 3 * DAY + 10), b"A"),
        // Rewritten before the sync that kept A: the file held B.
        (civil(NOW - 2 * DAY - 30 * 60), b"B"),
        // Between two syncs: B, the version replaced by the second (was
        // A, the one kept by the first).
        (civil(NOW - 2 * DAY + HOUR), b"B"),
        (stamp(NOW - 2 * DAY), b"B"),
        ("36h".into(), b"B"),
        ("1d30m".into(), b"C"),
        ("2026-11-24".into(), b"B"),
        ("2026-11-24 16:00".into(), b"C"),
    ];
    let before = snapshot(&dst);
    for (when, want) in cases {
        let run = restore_at(&when, &f, &["--to", "-"]);
        run.ok();
        assert_eq!(run.stdout, want, "--at {when}\n{run}");
    }
    // The current file holds since NOW-1d-1h: nothing to do.
    let run = restore_at("1d30m", &f, &[]);
    assert!(run.ok().out().contains("already as it was"), "{run}");
    // Before it was written: nothing to give back; nothing changes.
    let run = restore_at(&civil(NOW - 3 * DAY - 10), &f, &[]);
    run.code_is(2);
    assert!(run.err().contains("did not exist at"), "{run}");
    // g between its deletion and its new life did not exist.
    let run = restore_at(&civil(NOW - DAY - 12 * HOUR), &dst.join("g"), &[]);
    run.code_is(2);
    assert!(run.err().contains("did not exist at"), "{run}");
    let run = restore_at(&civil(NOW - 2 * DAY - HOUR), &dst.join("g"), &["--to", "-"]);
    run.ok();
    assert_eq!(run.stdout, b"g1");
    assert_same_content(&before, &snapshot(&dst));
    let run = restore_at("soon", &f, &[]);
    run.code_is(2);
    // In place: B back, C kept as a version (and listed as replaced now).
    let run = restore_at(&civil(NOW - 2 * DAY + HOUR), &f, &[]);
    run.ok();
    assert_eq!(fs::read(&f).unwrap(), b"B");
    let kept = dst.join(".ferry-versions").join(vname("f", NOW));
    assert_eq!(fs::read(kept).unwrap(), b"C", "{run}");
    // What it held a minute ago is what it held before the restore.
    let run = restore_at("1m", &f, &["--to", "-"]);
    assert_eq!(run.ok().stdout, b"C", "{run}");
}

#[test]
fn restore_keeps_the_current_file_as_a_version() {
    let t = tmpdir();
    let r = t.path().join("r");
    version(&r, "d/f.txt", NOW - DAY, b"good");
    let f = write(&r, "d/f.txt", b"bad edit");
    let run = at_now(&["restore".as_ref(), f.as_os_str()]);
    run.ok();
    assert_eq!(fs::read(&f).unwrap(), b"good");
    let kept = r.join(".ferry-versions/d").join(vname("f.txt", NOW));
    assert_eq!(fs::read(&kept).unwrap(), b"bad edit", "{run}");
    assert!(run.out().contains(&vname("f.txt", NOW)), "{run}");
    // Restoring the same again: it holds that already, nothing is kept.
    let run = at_now(&[
        "restore".as_ref(),
        "--at".as_ref(),
        stamp(NOW - DAY - 30).as_ref(),
        f.as_os_str(),
    ]);
    assert!(run.ok().out().starts_with("unchanged "), "{run}");
    assert_eq!(names(&r.join(".ferry-versions/d")).len(), 2);
    // Another edit in the same second, then a restore: kept under -2.
    rewrite_keep_meta(&f, b"gooD");
    let run = at_now(&[
        "restore".as_ref(),
        "--at".as_ref(),
        stamp(NOW - DAY - 30).as_ref(),
        f.as_os_str(),
    ]);
    run.ok();
    let second = r
        .join(".ferry-versions/d")
        .join(String::from_utf8(version_name(b"f.txt", &stamp(NOW), 2)).unwrap());
    assert_eq!(fs::read(second).unwrap(), b"gooD", "{run}");
    assert_eq!(fs::read(&f).unwrap(), b"good");
    assert_eq!(names(&r.join(".ferry-versions/d")).len(), 3);
}

/// A replica with versions of `f` at the given ages (seconds before NOW),
/// a directory whose only versions are old, and a name that is no version.
fn aged(r: &Path, ages: &[i64]) {
    // The live file as SRC has it (same bytes and mtime): the run replaces
    // nothing, so it keeps no version of its own.
    write(r, "f", b"live");
    set_mtime(&r.join("f"), (NOW - 3 * DAY, 0));
    for &a in ages {
        version(r, "f", NOW - a, &vec![b'x'; a as usize % 97]);
    }
    version(r, "old/g", NOW - 40 * DAY, b"old");
    write(r, ".ferry-versions/junk~1", b"not mine");
}

/// `ferry copy|bisync --versions EXTRA` over replicas that are in sync
/// already: the run changes nothing but prunes.
fn run_pruning(cmd: &str, a: &Path, b: &Path, extra: &[&str], j: &Path) -> Run {
    let mut args: Vec<OsString> = vec![cmd.into(), "--versions".into()];
    args.extend(extra.iter().map(OsString::from));
    if cmd == "bisync" {
        args.extend(["--journal".into(), j.as_os_str().to_owned()]);
    }
    args.extend([a.as_os_str().to_owned(), b.as_os_str().to_owned()]);
    at_now(&args)
}

#[test]
fn copy_prunes_exactly_what_the_policy_drops() {
    let ages = [
        10,
        20 * 60,
        HOUR + 5,
        HOUR + 900,
        5 * HOUR,
        2 * DAY,
        2 * DAY + 100,
        10 * DAY,
        45 * DAY,
        46 * DAY,
    ];
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "f", b"live");
    set_mtime(&src.join("f"), (NOW - 3 * DAY, 0));
    let j = t.path().join("j.sqlite");
    let left = |r: &Path| -> Vec<i64> {
        let mut v: Vec<i64> = names(&r.join(".ferry-versions"))
            .iter()
            .filter_map(|n| ferry_engine::keep::parse_version_name(n.as_bytes()))
            .filter(|(name, _, _)| name == b"f")
            .map(|(_, k, _)| NOW - k)
            .collect();
        v.sort();
        v
    };
    let cases: [(&[&str], &[i64]); 4] = [
        (&["--keep", "3"], &[10, 20 * 60, HOUR + 5]),
        (
            &["--keep-days", "2"],
            &[10, 20 * 60, HOUR + 5, HOUR + 900, 5 * HOUR, 2 * DAY],
        ),
        (
            &["--keep", "staggered"],
            &[10, 20 * 60, HOUR + 5, 5 * HOUR, 2 * DAY, 10 * DAY, 45 * DAY],
        ),
        (
            &["--keep", "staggered", "--keep-days", "7"],
            &[10, 20 * 60, HOUR + 5, 5 * HOUR, 2 * DAY],
        ),
    ];
    for (i, (flags, want)) in cases.iter().enumerate() {
        let dst = t.path().join(format!("dst{i}"));
        aged(&dst, &ages);
        let run = run_pruning("copy", &src, &dst, flags, &j);
        run.ok();
        assert_eq!(left(&dst), *want, "{flags:?}\n{run}");
        assert!(run.err().contains("pruned"), "{run}");
        // Untouched: the live file, names that are no versions.
        assert_eq!(fs::read(dst.join("f")).unwrap(), b"live");
        assert!(dst.join(".ferry-versions/junk~1").exists());
        // The directory whose versions all went is gone with them.
        let old_dir = dst.join(".ferry-versions/old");
        let old_kept = flags.contains(&"staggered") && !flags.contains(&"--keep-days");
        assert_eq!(
            old_dir.exists(),
            old_kept || *flags == ["--keep", "3"],
            "{flags:?}"
        );
        // Pruning twice is pruning once.
        let again = run_pruning("copy", &src, &dst, flags, &j);
        again.ok();
        assert_eq!(left(&dst), *want, "{flags:?}\n{again}");
        assert!(!again.err().contains("pruned"), "{again}");
    }

    // A dry run, or no policy: nothing pruned.
    let dst = t.path().join("dry");
    aged(&dst, &ages);
    run_pruning("copy", &src, &dst, &["-n", "--keep", "1"], &j).ok();
    run_pruning("copy", &src, &dst, &[], &j).ok();
    assert_eq!(left(&dst).len(), ages.len());
}

#[test]
fn bisync_prunes_both_replicas_with_json_records() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let j = t.path().join("j.sqlite");
    write(&a, "f", b"live");
    write(&b, "f", b"live");
    set_mtime(&a.join("f"), (NOW, 0));
    set_mtime(&b.join("f"), (NOW, 0));
    for r in [&a, &b] {
        version(r, "f", NOW - 10, b"1");
        version(r, "f", NOW - 20, b"22");
        version(r, "f", NOW - 30, b"333");
    }
    let run = run_pruning("bisync", &a, &b, &["--resync", "--keep", "1", "--json"], &j);
    run.ok();
    for r in [&a, &b] {
        assert_eq!(
            names(&r.join(".ferry-versions")),
            [vname("f", NOW - 10)],
            "{run}"
        );
    }
    let records: Vec<serde_json::Value> = run
        .out()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "versions_pruned")
        .collect();
    assert_eq!(records.len(), 2, "{run}");
    assert!(
        records.iter().all(|v| v["pruned"] == 2 && v["bytes"] == 5),
        "{run}"
    );
}

#[test]
fn s3_versions_and_restore() {
    if !Command::new("sh")
        .args(["-c", "command -v garage"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("skipped: no garage");
        return;
    }
    let Some(s3) = crate::util::s3::s3() else {
        return;
    };
    let t = tmpdir();
    let url = s3.url("versions");
    // Versions uploaded one by one (with their mtimes), and a live file.
    let v1 = version(t.path(), "d/f.txt", NOW - DAY, b"one");
    let v2 = version(t.path(), "d/f.txt", NOW - HOUR, b"two!");
    for v in [&v1, &v2] {
        let name = v.file_name().unwrap().to_str().unwrap();
        at_now(&[
            "copy".as_ref(),
            v.as_os_str(),
            format!("{url}/.ferry-versions/d/{name}").as_ref(),
        ])
        .ok();
    }
    let live = write(t.path(), "live/other", b"x");
    at_now(&[
        "copy".as_ref(),
        live.as_os_str(),
        format!("{url}/d/other").as_ref(),
    ])
    .ok();

    let file = format!("{url}/d/f.txt");
    let run = at_now(&["versions", file.as_str()]);
    run.ok();
    let lines: Vec<&str> = run
        .stdout
        .split(|&c| c == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| std::str::from_utf8(l).unwrap())
        .collect();
    // The header, then newest first (no current file: deleted).
    assert_eq!(lines.len(), 3, "{run}");
    assert!(
        lines[1].starts_with("2026-11-25 15:32:43  2026-11-25 15:33:43"),
        "{run}"
    );
    assert!(
        lines[1].contains(&format!("{url}/.ferry-versions/d/")),
        "{run}"
    );
    let run = at_now(&["versions", format!("{url}/d").as_str()]);
    assert!(run.ok().out().contains("  2  deleted  "), "{run}");

    // What it held 1d30s ago: the version written at NOW-1d-60s.
    let run = at_now(&["restore", "--at", "1d30s", file.as_str()]);
    run.ok();
    let back = t.path().join("back");
    at_now(&["copy".as_ref(), file.as_ref(), back.as_os_str()]).ok();
    assert_eq!(fs::read(&back).unwrap(), b"one");
    assert_eq!(get_mtime(&back), (NOW - DAY - 60, 0));
    let run = at_now(&["versions", format!("{url}/nothing/here").as_str()]);
    run.code_is(2);
    // A path that would leave the replica is refused, whatever it names.
    for p in ["d/../../x", "d/./f.txt"] {
        let run = at_now(&["restore", "--at", "now", format!("{url}/{p}").as_str()]);
        run.code_is(2);
        assert_eq!(run.error_lines().len(), 1, "{run}");
    }
    let run = at_now(&[
        "versions",
        format!("s3://{}/no-such-replica-{NOW}/f", s3.bucket).as_str(),
    ]);
    run.code_is(2);
}

#[test]
fn versions_at_lists_a_directory_as_it_was() {
    let t = tmpdir();
    let (src, dst) = nightly(t.path());
    // h: written and synced at NOW-1d, after the time asked.
    write(&src, "sub/h", b"h");
    set_mtime(&src.join("sub/h"), (NOW - DAY + 60, 0));
    // k: written at NOW-3d, deleted since (kept at NOW-1d+120).
    write(&src, "sub/k", b"k1");
    set_mtime(&src.join("sub/k"), (NOW - 3 * DAY, 0));
    sync_at(NOW - DAY + 100, &src, &dst);
    fs::remove_file(src.join("sub/k")).unwrap();
    sync_at(NOW - DAY + 120, &src, &dst);

    let when = civil(NOW - 2 * DAY + HOUR);
    let run = at_now(&[
        "versions".as_ref(),
        "--at".as_ref(),
        when.as_ref(),
        dst.as_os_str(),
    ]);
    run.ok();
    let rows: Vec<Vec<String>> = run
        .out()
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    let d = dst.canonicalize().unwrap();
    let p = |r: &str| d.join(r).display().to_string();
    let row = |state: &str, written: i64, size: &str, rel: &str| -> Vec<String> {
        let c = civil(written);
        let (day, time) = c.split_once(' ').unwrap();
        vec![state.into(), day.into(), time.into(), size.into(), p(rel)]
    };
    assert_eq!(
        rows,
        [
            vec![
                "STATE".to_string(),
                "WRITTEN".into(),
                "SIZE".into(),
                "PATH".into()
            ],
            // f held B then, C now; g did not exist then; k held k1, gone
            // now; h was not written yet.
            row("changed", NOW - 2 * DAY - HOUR, "1", "f"),
            row("deleted", NOW - 3 * DAY, "2", "sub/k"),
        ],
        "{run}"
    );
    // Now: every live file, current.
    let run = at_now(&[
        "versions".as_ref(),
        "--at".as_ref(),
        "now".as_ref(),
        dst.as_os_str(),
    ]);
    let out = run.ok().out();
    let states: Vec<&str> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(states, ["current"; 3], "{run}");
    // --json: one state object per file.
    let run = at_now(&[
        "versions".as_ref(),
        "--json".as_ref(),
        "--at".as_ref(),
        when.as_ref(),
        dst.join("sub").as_os_str(),
    ]);
    let v: Vec<serde_json::Value> = run
        .ok()
        .out()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(v.len(), 1, "{run}");
    assert_eq!(v[0]["type"], "state");
    assert_eq!(v[0]["path"], "sub/k");
    assert_eq!(v[0]["state"], "deleted");
}

#[test]
fn restore_a_directory_as_of_a_time() {
    let t = tmpdir();
    let (src, dst) = nightly(t.path());
    write(&src, "new", b"made after");
    sync_at(NOW - DAY + 100, &src, &dst);
    let when = civil(NOW - 2 * DAY + HOUR);

    // Without --at a directory is refused.
    let run = at_now(&["restore".as_ref(), dst.as_os_str()]);
    run.code_is(2);
    // -n changes nothing.
    let before = snapshot(&dst);
    let run = restore_at(&when, &dst, &["-n"]);
    run.ok();
    assert!(run.out().contains("would restore"), "{run}");
    assert_untouched(&before, &snapshot(&dst));

    // Into another directory: the tree as it was.
    let out = t.path().join("out");
    let run = restore_at(&when, &dst, &["--to", out.to_str().unwrap()]);
    run.ok();
    assert_eq!(fs::read(out.join("f")).unwrap(), b"B", "{run}");
    assert_eq!(get_mtime(&out.join("f")), (NOW - 2 * DAY - HOUR, 0));
    assert!(
        !out.join("g").exists() && !out.join("new").exists(),
        "{run}"
    );
    assert!(!out.join(".ferry-versions").exists());
    assert_untouched(&before, &snapshot(&dst));

    // In place: f back to B (C kept), g and new (absent then) left.
    let run = restore_at(&when, &dst, &[]);
    run.ok();
    assert!(run.err().contains("restored 1 file as of"), "{run}");
    assert!(
        run.err()
            .contains("2 that did not exist then left as they are"),
        "{run}"
    );
    assert_eq!(fs::read(dst.join("f")).unwrap(), b"B");
    assert_eq!(fs::read(dst.join("g")).unwrap(), b"g2");
    assert_eq!(fs::read(dst.join("new")).unwrap(), b"made after");
    assert_eq!(
        fs::read(dst.join(".ferry-versions").join(vname("f", NOW))).unwrap(),
        b"C"
    );
    // Again: f holds B already; nothing is kept twice.
    let n = names(&dst.join(".ferry-versions")).len();
    let run = restore_at(&when, &dst, &[]);
    assert!(run.ok().err().contains("restored 0 files"), "{run}");
    assert!(run.err().contains("1 unchanged since"), "{run}");
    assert_eq!(fs::read(dst.join("f")).unwrap(), b"B");
    assert_eq!(names(&dst.join(".ferry-versions")).len(), n);
    // A directory restore --to a directory never replaces its files.
    fs::write(out.join("f"), b"mine").unwrap();
    let run = restore_at(&when, &dst, &["--to", out.to_str().unwrap()]);
    run.code_is(1);
    assert!(run.err().contains("never replaces"), "{run}");
    assert_eq!(fs::read(out.join("f")).unwrap(), b"mine");
}

#[test]
fn restore_to_a_path_or_to_stdout_keeps_what_it_replaces() {
    let t = tmpdir();
    let r = t.path().join("r");
    version(&r, "d/f.txt", NOW - DAY, b"old");
    write(&r, "d/f.txt", b"new");
    // --to -: the content, nothing else.
    let before = snapshot(&r);
    let run = at_now(&[
        "restore".as_ref(),
        "--to".as_ref(),
        "-".as_ref(),
        r.join("d/f.txt").as_os_str(),
    ]);
    assert_eq!(run.ok().stdout, b"old", "{run}");
    assert!(run.err().is_empty(), "{run}");
    assert_untouched(&before, &snapshot(&r));
    // A directory cannot go to stdout.
    let run = at_now(&["restore", "--at", "now", "--to", "-", r.to_str().unwrap()]);
    run.code_is(2);

    // --to a new path.
    let other = t.path().join("other.txt");
    let run = at_now(&[
        "restore".as_ref(),
        "--to".as_ref(),
        other.as_os_str(),
        r.join("d/f.txt").as_os_str(),
    ]);
    run.ok();
    assert_eq!(fs::read(&other).unwrap(), b"old");
    assert_eq!(fs::read(r.join("d/f.txt")).unwrap(), b"new");
    // --to never replaces a file (it is no version of this one).
    fs::write(&other, b"precious").unwrap();
    let file = r.join("d/f.txt");
    for n in [&["-n"][..], &[]] {
        let mut args: Vec<&std::ffi::OsStr> =
            vec!["restore".as_ref(), "--to".as_ref(), other.as_os_str()];
        args.extend(n.iter().map(std::ffi::OsStr::new));
        args.push(file.as_os_str());
        let run = at_now(&args);
        run.code_is(2);
        assert!(run.err().contains("never replaces"), "{run}");
        assert_eq!(fs::read(&other).unwrap(), b"precious");
    }
    // --to a directory: the file goes in it under its name.
    let dir = t.path().join("into");
    fs::create_dir(&dir).unwrap();
    at_now(&[
        "restore".as_ref(),
        "--to".as_ref(),
        dir.as_os_str(),
        r.join("d/f.txt").as_os_str(),
    ])
    .ok();
    assert_eq!(fs::read(dir.join("f.txt")).unwrap(), b"old");
    // Nothing was added to the versions directory.
    assert_eq!(names(&r.join(".ferry-versions/d")).len(), 1);
}

#[test]
fn restore_from_dst_into_src_survives_the_next_sync() {
    let t = tmpdir();
    let (src, dst) = nightly(t.path());
    // A decoy: DST has a directory named as SRC is, with an f in it; SRC's
    // f is DST's f all the same (DST's root shares more names with SRC).
    write(&dst, "src/f", b"decoy");
    // An edit in SRC not synced yet.
    write(&src, "f", b"D unsynced");
    let when = civil(NOW - 2 * DAY + HOUR);
    // PATH in SRC, versions in DST: `--from DST`.
    let mut c = Command::new(bin());
    c.args(["restore", "--from"])
        .arg(&dst)
        .args(["--at", &when, "f"])
        .current_dir(&src)
        .env("FERRY_TEST_NOW", NOW.to_string())
        .env("TZ", "UTC");
    let run = run_within(c, std::time::Duration::from_secs(600));
    run.ok();
    assert_eq!(fs::read(src.join("f")).unwrap(), b"B", "{run}");
    // The unsynced edit is kept, in DST's versions.
    let kept = dst.join(".ferry-versions").join(vname("f", NOW));
    assert_eq!(fs::read(&kept).unwrap(), b"D unsynced", "{run}");
    // The next sync carries the restore to DST (its C kept in turn).
    sync_at(NOW + 10, &src, &dst);
    assert_eq!(fs::read(dst.join("f")).unwrap(), b"B");
    assert_eq!(fs::read(src.join("f")).unwrap(), b"B");
    let kept = dst.join(".ferry-versions").join(vname("f", NOW + 10));
    assert_eq!(fs::read(&kept).unwrap(), b"C");
    // A directory of SRC as it was, from DST.
    let run = at_now(&[
        "restore".as_ref(),
        "--from".as_ref(),
        dst.as_os_str(),
        "--at".as_ref(),
        civil(NOW - 2 * DAY - 2 * HOUR).as_ref(),
        src.as_os_str(),
    ]);
    run.ok();
    assert_eq!(fs::read(src.join("f")).unwrap(), b"A", "{run}");
    // A path DST knows nothing of.
    let run = at_now(&[
        "restore".as_ref(),
        "--from".as_ref(),
        dst.as_os_str(),
        src.join("nope").as_os_str(),
    ]);
    run.code_is(2);
}

#[test]
fn retention_flags_that_cannot_apply_are_refused() {
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "f", b"x");
    let dst = t.path().join("dst");
    for flags in [
        &["--keep", "5", "--backup-dir", "../bak"][..],
        &["--keep-days", "3", "--suffix", ".old"],
        &["--keep", "2"],
        &["--versions", "--keep-days", "0"],
    ] {
        let mut args: Vec<&str> = vec!["sync"];
        args.extend(flags);
        args.extend([src.to_str().unwrap(), dst.to_str().unwrap()]);
        let run = ferry(&args);
        run.code_is(2);
        assert!(run.err().contains("--keep"), "{run}");
        assert!(!dst.exists(), "{flags:?}");
    }
}

#[test]
fn watch_prunes_after_each_run_that_kept() {
    for cmd in ["sync", "bisync"] {
        let t = tmpdir();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        write(&src, "d/f", b"0");
        let mut c = Command::new(bin());
        c.args([cmd, "--versions", "--keep", "2", "--watch"]);
        if cmd == "bisync" {
            c.arg("--journal")
                .arg(t.path().join("j.sqlite"))
                .arg("--resync");
        }
        c.arg(&src).arg(&dst);
        let mut w = crate::util::watch::Watch::spawn(c);
        let kept = || {
            names(&dst.join(".ferry-versions/d"))
                .iter()
                .filter(|n| n.starts_with("f~"))
                .count()
        };
        let until = |what: &str, ok: &dyn Fn() -> bool, w: &mut crate::util::watch::Watch| {
            let end = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while !ok() {
                assert!(
                    std::time::Instant::now() < end,
                    "{cmd}: {what}\n{}",
                    w.stderr()
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        };
        until(
            "first copy",
            &|| fs::read(dst.join("d/f")).is_ok_and(|d| d == b"0"),
            &mut w,
        );
        // Each save replaces DST's file, which is kept; each waited for.
        for i in 1..=6 {
            let data = i.to_string();
            fs::write(src.join("d/f"), &data).unwrap();
            until(
                "a save synced",
                &|| fs::read(dst.join("d/f")).is_ok_and(|d| d == data.as_bytes()),
                &mut w,
            );
        }
        // Six versions were kept; each run that kept one pruned its
        // directory, to 2.
        until("pruned to 2", &|| kept() == 2, &mut w);
        assert!(w.stderr().contains("pruned"), "{cmd}: {}", w.stderr());
    }
}

/// Planted state (HOSTILE.md): symlinks in `.ferry-versions`, to a
/// directory and to a file outside the replica, are never followed: no
/// version is read through them, nothing is written through them.
#[test]
fn planted_symlinks_in_the_versions_directory_are_not_followed() {
    let t = tmpdir();
    let r = t.path().join("r");
    let outside = t.path().join("outside");
    write(&outside, vname("x", NOW - DAY), b"planted");
    write(&outside, "secret", b"secret");
    write(&r, "sub/x", b"mine");
    write(&r, "y", b"live y");
    fs::create_dir_all(r.join(".ferry-versions")).unwrap();
    std::os::unix::fs::symlink(&outside, r.join(".ferry-versions/sub")).unwrap();
    std::os::unix::fs::symlink(
        outside.join("secret"),
        r.join(".ferry-versions").join(vname("y", NOW - DAY)),
    )
    .unwrap();
    let before = (snapshot(&r), snapshot(&outside));

    let run = at_now(&["versions".as_ref(), r.join("sub/x").as_os_str()]);
    run.ok();
    assert!(
        !run.out().contains("planted") && run.err().contains("no versions"),
        "{run}"
    );
    let run = at_now(&["restore".as_ref(), r.join("sub/x").as_os_str()]);
    run.code_is(2);
    // The directory as it was a day and a half ago: the planted version
    // is not seen.
    let run = restore_at("36h", &r, &[]);
    assert!(!run.all().contains("planted"), "{run}");
    assert_eq!(fs::read(r.join("sub/x")).unwrap(), b"mine");
    // A version that is a symlink is restored as a symlink (never its
    // target's content), and never to stdout.
    let y = r.join("y");
    let run = at_now(&[
        "restore".as_ref(),
        "--to".as_ref(),
        "-".as_ref(),
        y.as_os_str(),
    ]);
    run.code_is(2);
    assert!(run.err().contains("a symlink"), "{run}");
    assert!(run.stdout.is_empty(), "{run}");
    assert_untouched(&before.1, &snapshot(&outside));
    let run = at_now(&["restore".as_ref(), y.as_os_str()]);
    run.ok();
    assert_eq!(fs::read_link(r.join("y")).unwrap(), outside.join("secret"));
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"secret");
    // The live y it replaced is kept, as a file.
    let kept = r.join(".ferry-versions").join(vname("y", NOW));
    assert_eq!(fs::read(&kept).unwrap(), b"live y", "{run}");
    assert!(fs::symlink_metadata(&kept).unwrap().is_file());
    assert_untouched(&before.1, &snapshot(&outside));
    // --from into a SRC whose twin's versions directory is the planted
    // link: the copy of what SRC holds cannot be kept there, so nothing
    // is replaced.
    let src = t.path().join("src");
    write(&src, "sub/x", b"src x");
    set_mtime(&r.join("sub/x"), (NOW - HOUR, 0));
    let run = at_now(&[
        "restore".as_ref(),
        "--from".as_ref(),
        r.as_os_str(),
        "--at".as_ref(),
        "now".as_ref(),
        src.join("sub/x").as_os_str(),
    ]);
    run.code_is(2);
    assert!(run.err().contains("not restored"), "{run}");
    assert_eq!(fs::read(src.join("sub/x")).unwrap(), b"src x", "{run}");
    assert_untouched(&before.1, &snapshot(&outside));
}

#[test]
fn backup_dir_trees_are_versions_too() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    // Three runs with --backup-dir ../old --suffix .bak, one second apart
    // (a backup's keep time is its change time).
    let clock = tmpdir();
    let clock = clock.path();
    let mut contents = Vec::new();
    for (i, data) in [&b"one"[..], b"two", b"three"].iter().enumerate() {
        write(&src, "d/f", data);
        set_mtime(&src.join("d/f"), (NOW + i as i64, 0));
        ferry([
            "sync".as_ref(),
            "--backup-dir".as_ref(),
            "../old".as_ref(),
            "--suffix".as_ref(),
            ".bak".as_ref(),
            src.as_os_str(),
            dst.as_os_str(),
        ])
        .ok();
        contents.push(data.to_vec());
        // Time passing, not a wait for ferry: until the clock's whole second
        // (as a change time reads it) is past everything this run did.
        let tick = || {
            use std::os::unix::fs::MetadataExt;
            write(clock, "tick", b"");
            fs::metadata(clock.join("tick")).unwrap().ctime()
        };
        let now = tick();
        while tick() <= now {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let old = t.path().join("old");
    assert_eq!(names(&old.join("d")), ["f.bak", "f.bak1.bak"]);
    let vers = |extra: &[&str], p: &Path| -> Run {
        let mut args: Vec<OsString> = vec![
            "versions".into(),
            "--backup-dir".into(),
            "../old".into(),
            "--suffix".into(),
            ".bak".into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        args.push(p.as_os_str().to_owned());
        at_now(&args)
    };
    let run = vers(&[], &dst.join("d/f"));
    run.ok();
    let lines: Vec<String> = run.out().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 4, "{run}");
    assert!(lines[1].contains("(current)"), "{run}");
    let o = old.canonicalize().unwrap();
    assert!(
        lines[2].ends_with(&format!("{}/d/f.bak1.bak", o.display())),
        "{run}"
    );
    assert!(
        lines[3].ends_with(&format!("{}/d/f.bak", o.display())),
        "{run}"
    );
    // The directory: f with 2 versions, present.
    let run = vers(&[], &dst);
    assert!(
        run.ok()
            .out()
            .lines()
            .nth(1)
            .unwrap()
            .contains("  2  present  "),
        "{run}"
    );
    // Without --backup-dir there are no versions to see.
    at_now(&["versions".as_ref(), dst.join("d/f").as_os_str()]).code_is(2);

    // Restore the second one in place: what it replaces goes to the
    // backup directory, under the next name.
    let run = at_now(&[
        "restore".as_ref(),
        "--backup-dir".as_ref(),
        "../old".as_ref(),
        "--suffix".as_ref(),
        ".bak".as_ref(),
        "--at".as_ref(),
        civil(NOW + 1).as_ref(),
        dst.join("d/f").as_os_str(),
    ]);
    run.ok();
    assert_eq!(fs::read(dst.join("d/f")).unwrap(), b"two", "{run}");
    assert_eq!(
        fs::read(old.join("d/f.bak2.bak")).unwrap(),
        b"three",
        "{run}"
    );
    assert!(!dst.join(".ferry-versions").exists());
    // --keep with --backup-dir is refused (it would prune nothing).
    let run = ferry([
        "sync".as_ref(),
        "--backup-dir".as_ref(),
        "../old".as_ref(),
        "--keep".as_ref(),
        "1".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ]);
    run.code_is(2);
}

/// Over ssh: `versions --at` of a remote replica, and `restore --from
/// host:DST` into a local SRC (what SRC held kept in DST's versions, on
/// the server).
#[test]
fn versions_at_and_restore_from_over_ssh() {
    use crate::util::ssh::{ssh_at, ssh_server};
    let (rsh, host) = ssh_server().unwrap();
    let t = tmpdir();
    let (src, dst) = nightly(t.path());
    let when = civil(NOW - 2 * DAY + HOUR);
    let with_clock = |cmd: &str, args: &[OsString]| -> Run {
        let mut a: Vec<OsString> = vec![cmd.into(), "-e".into(), rsh.clone().into()];
        a.push("--remote-ferry".into());
        a.push(bin());
        a.extend(args.iter().cloned());
        at_now(&a)
    };
    let run = with_clock(
        "versions",
        &["--at".into(), when.clone().into(), ssh_at(&host, &dst)],
    );
    run.ok();
    let rows: Vec<&str> = run
        .stdout
        .split(|&c| c == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| std::str::from_utf8(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{run}");
    assert!(
        rows[1].starts_with("changed  ") && rows[1].ends_with("/f"),
        "{run}"
    );

    write(&src, "f", b"unsynced");
    let run = with_clock(
        "restore",
        &[
            "--from".into(),
            ssh_at(&host, &dst),
            "--at".into(),
            when.into(),
            src.join("f").into(),
        ],
    );
    run.ok();
    assert_eq!(fs::read(src.join("f")).unwrap(), b"B", "{run}");
    let kept = dst.join(".ferry-versions").join(vname("f", NOW));
    assert_eq!(fs::read(kept).unwrap(), b"unsynced", "{run}");
}

/// Hostile names (a newline, a tab, invalid UTF-8) in every output of
/// versions and restore: one line per file, escaped; `--json` exact.
#[test]
fn hostile_names_stay_on_their_line() {
    use std::os::unix::ffi::OsStrExt;
    let t = tmpdir();
    let r = t.path().join("r");
    let name = std::ffi::OsStr::from_bytes(b"a\nb\t\xff.txt");
    let vpath = r
        .join(".ferry-versions")
        .join(std::ffi::OsStr::from_bytes(&version_name(
            name.as_bytes(),
            &stamp(NOW - DAY),
            1,
        )));
    fs::create_dir_all(vpath.parent().unwrap()).unwrap();
    fs::write(&vpath, b"old").unwrap();
    set_mtime(&vpath, (NOW - 2 * DAY, 0));
    let live = r.join(name);
    fs::write(&live, b"new").unwrap();
    for args in [
        vec!["versions".into(), live.clone().into_os_string()],
        vec!["versions".into(), r.clone().into_os_string()],
        vec![
            "versions".into(),
            "--at".into(),
            "36h".into(),
            r.clone().into_os_string(),
        ],
    ] {
        let run = at_now(&args);
        run.ok();
        let n = run
            .stdout
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        assert!(n == 2 || n == 3, "{run}");
        assert!(!run.stdout.contains(&0xff), "{run}");
    }
    let run = at_now(&[
        OsString::from("versions"),
        "--json".into(),
        "--at".into(),
        "36h".into(),
        r.clone().into(),
    ]);
    let j: serde_json::Value = serde_json::from_slice(run.ok().stdout.trim_ascii()).unwrap();
    assert!(j["path_bytes"].is_string(), "{run}");
    let run = at_now(&[
        OsString::from("restore"),
        "--at".into(),
        "36h".into(),
        live.clone().into(),
    ]);
    run.ok();
    assert_eq!(
        run.stdout.iter().filter(|&&c| c == b'\n').count(),
        1,
        "{run}"
    );
    assert_eq!(fs::read(&live).unwrap(), b"old");
}

/// Non-root (HOSTILE.md): a user who may not write the file's directory
/// gets one error line and exit 2; the file is as it was, and nothing of
/// it is lost.
#[test]
fn a_restore_that_may_not_write_loses_nothing() {
    use std::os::unix::fs::chown;
    if !is_root() {
        eprintln!("note: needs root to switch to user nobody: skipped");
        return;
    }
    let t = tmpdir();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let exe = t.path().join("ferry");
    fs::copy(bin(), &exe).unwrap();
    let r = t.path().join("r");
    version(&r, "ro/f", NOW - DAY, b"old");
    write(&r, "ro/f", b"current");
    for p in [
        r.clone(),
        r.join("ro"),
        r.join("ro/f"),
        r.join(".ferry-versions"),
        r.join(".ferry-versions/ro"),
    ] {
        chown(&p, Some(65534), Some(65534)).unwrap();
    }
    fs::set_permissions(r.join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .arg("restore")
        .arg(r.join("ro/f"))
        .env("FERRY_TEST_NOW", NOW.to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("setpriv:") {
        eprintln!("note: cannot run as nobody (setpriv): skipped");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not restored"), "{err}");
    assert_eq!(fs::read(r.join("ro/f")).unwrap(), b"current");
    fs::set_permissions(r.join("ro"), fs::Permissions::from_mode(0o755)).unwrap();
}

/// A restore into a bisync replica is a change like any other: the next
/// bisync carries it to the other side (whose file is kept there).
#[test]
fn a_restore_in_a_bisync_replica_is_propagated() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let j = t.path().join("j.sqlite");
    write(&a, "f", b"first");
    set_mtime(&a.join("f"), (NOW - 2 * DAY, 0));
    let bisync = |at: i64, extra: &[&str]| {
        let mut args: Vec<OsString> = vec![
            "bisync".into(),
            "--versions".into(),
            "--journal".into(),
            j.clone().into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        args.extend([a.clone().into(), b.clone().into()]);
        at_time(at, &args).ok();
    };
    bisync(NOW - 2 * DAY + 10, &["--resync"]);
    write(&a, "f", b"second");
    set_mtime(&a.join("f"), (NOW - DAY, 0));
    bisync(NOW - DAY + 10, &[]);
    assert_eq!(fs::read(b.join("f")).unwrap(), b"second");
    // B as it was two days ago.
    let run = restore_at(&civil(NOW - 2 * DAY + HOUR), &b.join("f"), &[]);
    run.ok();
    assert_eq!(fs::read(b.join("f")).unwrap(), b"first");
    bisync(NOW + 10, &[]);
    assert_eq!(fs::read(a.join("f")).unwrap(), b"first");
    let kept = a.join(".ferry-versions").join(vname("f", NOW + 10));
    assert_eq!(fs::read(kept).unwrap(), b"second");
}

/// `restore --to` an ssh, SFTP or S3 destination (and `--from` into a
/// remote PATH): refused in one line before any replica is read, naming
/// what to do instead; nothing is written.
#[test]
fn restore_to_a_remote_destination_is_refused_in_one_line() {
    let t = tmpdir();
    let r = t.path().join("r");
    version(&r, "f.txt", NOW - DAY, b"old");
    for to in [
        "host.invalid:/tmp/f.txt",
        "sftp://host.invalid/tmp/f.txt",
        "s3://bucket/f.txt",
    ] {
        let run = at_now(&[
            "restore".as_ref(),
            "--to".as_ref(),
            to.as_ref(),
            r.join("f.txt").as_os_str(),
        ]);
        run.code_is(2);
        let err = run.err();
        assert_eq!(err.lines().count(), 1, "{run}");
        assert!(err.contains(&format!("--to {to}")), "{run}");
        assert!(
            err.contains("restore to a local path, then `ferry copy`"),
            "{run}"
        );
        assert!(!r.join("f.txt").exists(), "{run}");
    }
    let run = at_now(&[
        "restore".as_ref(),
        "--from".as_ref(),
        r.as_os_str(),
        "host.invalid:/tmp/f.txt".as_ref(),
    ]);
    run.code_is(2);
    assert!(
        run.err().contains("a restore writes to a local path only"),
        "{run}"
    );
}
