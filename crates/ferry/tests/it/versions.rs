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

/// `ferry ARGS` with the clock at `NOW`.
fn at_now<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    let mut c = Command::new(bin());
    c.args(args).env("FERRY_TEST_NOW", NOW.to_string());
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

    let run = at_now(&["versions".as_ref(), r.join("d/f.txt").as_os_str()]);
    run.ok();
    let lines: Vec<String> = run.out().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 2, "{run}");
    assert!(lines[0].starts_with("2026-11-25 15:33:43"), "{run}");
    assert!(lines[0].contains(" 6  2026-11-25 15:32:43  "), "{run}");
    assert!(
        lines[0].ends_with(&format!(
            "{}/.ferry-versions/d/{}",
            r.canonicalize().unwrap().display(),
            vname("f.txt", NOW - HOUR)
        )),
        "{run}"
    );
    assert!(lines[1].starts_with("2026-11-25 14:33:43"), "{run}");

    // A deleted file, from a subdirectory of the replica as the working
    // directory's relative path.
    let mut c = Command::new(bin());
    c.args(["versions", "--json", "gone.txt"])
        .current_dir(r.join("d"))
        .env("FERRY_TEST_NOW", NOW.to_string());
    let run = run_within(c, std::time::Duration::from_secs(600));
    run.ok();
    let v: serde_json::Value = serde_json::from_str(run.out().trim()).unwrap();
    assert_eq!(v["path"], "d/gone.txt");
    assert_eq!(v["kept"], "2026-11-24T16:33:43Z");
    assert_eq!(v["size"], 7);

    // A directory: each file with versions, once.
    let run = at_now(&["versions".as_ref(), r.as_os_str()]);
    run.ok();
    let out = run.out();
    assert_eq!(out.lines().count(), 2, "{run}");
    assert!(
        out.contains("2 versions") && out.contains("d/f.txt"),
        "{run}"
    );
    assert!(
        out.contains("1 version ") && out.contains("d/gone.txt"),
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

#[test]
fn restore_at_takes_the_newest_kept_at_or_before() {
    let t = tmpdir();
    let r = t.path().join("r");
    let times = [NOW - 3 * DAY, NOW - DAY, NOW - 2 * HOUR];
    for (i, &k) in times.iter().enumerate() {
        version(&r, "f", k, format!("v{i}").as_bytes());
    }
    let f = r.join("f");
    let cases: [(String, &[u8]); 6] = [
        (stamp(NOW - DAY), b"v1"),
        ("2026-11-24T16:33:43Z".into(), b"v1"),
        ("2026-11-24 16:33".into(), b"v0"),
        ("3h".into(), b"v1"),
        ("1h".into(), b"v2"),
        ("2026-11-23".into(), b"v0"),
    ];
    for (when, want) in cases {
        fs::remove_file(&f).ok();
        let run = at_now(&[
            "restore".as_ref(),
            "--at".as_ref(),
            when.as_ref(),
            f.as_os_str(),
        ]);
        run.ok();
        assert_eq!(fs::read(&f).unwrap(), want, "--at {when}\n{run}");
    }
    fs::remove_file(&f).unwrap();
    let run = at_now(&[
        "restore".as_ref(),
        "--at".as_ref(),
        "4d".as_ref(),
        f.as_os_str(),
    ]);
    run.code_is(2);
    assert!(run.err().contains("no version kept at or before"), "{run}");
    assert!(!f.exists());
    let run = at_now(&[
        "restore".as_ref(),
        "--at".as_ref(),
        "soon".as_ref(),
        f.as_os_str(),
    ]);
    run.code_is(2);
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
    // Restoring again (same second) keeps that state too, under -2.
    let run = at_now(&[
        "restore".as_ref(),
        "--at".as_ref(),
        "1h".as_ref(),
        f.as_os_str(),
    ]);
    run.ok();
    let second = r
        .join(".ferry-versions/d")
        .join(String::from_utf8(version_name(b"f.txt", &stamp(NOW), 2)).unwrap());
    assert_eq!(fs::read(second).unwrap(), b"good");
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
    assert_eq!(lines.len(), 2, "{run}");
    assert!(lines[0].starts_with("2026-11-25 15:33:43"), "{run}");
    assert!(
        lines[0].contains(&format!("{url}/.ferry-versions/d/")),
        "{run}"
    );
    let run = at_now(&["versions", format!("{url}/d").as_str()]);
    assert!(run.ok().out().contains("2 versions"), "{run}");

    let run = at_now(&["restore", "--at", "2h", file.as_str()]);
    run.ok();
    let back = t.path().join("back");
    at_now(&["copy".as_ref(), file.as_ref(), back.as_os_str()]).ok();
    assert_eq!(fs::read(&back).unwrap(), b"one");
    assert_eq!(get_mtime(&back), (NOW - DAY - 60, 0));
    let run = at_now(&["versions", format!("{url}/nothing/here").as_str()]);
    run.code_is(2);
    let run = at_now(&[
        "versions",
        format!("s3://{}/no-such-replica-{NOW}/f", s3.bucket).as_str(),
    ]);
    run.code_is(2);
}
