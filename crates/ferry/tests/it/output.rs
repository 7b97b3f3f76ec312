//! Output that cannot lie (docs/CLI.md, "Output encoding"): names escaped in every text
//! line so none can forge a line, non-UTF-8 names lossless in `--json`, and a JSON summary
//! for a refused `--json` run.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::util::*;

// ------------------------------------------------------------------------------------------
// Decoders written from the contract (independent of ferry's encoder)
// ------------------------------------------------------------------------------------------

/// Text escapes: `\\`, `\n`, `\t`, `\r`, `\xHH` stand for one byte, every other byte for
/// itself.
#[track_caller]
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b'\\') => out.push(b'\\'),
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b'r') => out.push(b'\r'),
            Some(b'x') => {
                let h = std::str::from_utf8(&b[i + 2..i + 4]).unwrap();
                out.push(u8::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad \\x in {s:?}")));
                i += 2;
            }
            _ => panic!("bad escape in {s:?}"),
        }
        i += 2;
    }
    out
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::prelude::BASE64_STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("bad base64 {s:?}: {e}"))
}

/// The exact bytes of a name field of a JSON record: `KEY_bytes` when present, else `KEY`.
#[track_caller]
fn name_of(j: &Json, key: &str) -> Option<Vec<u8>> {
    if let Some(b) = j.get(format!("{key}_bytes")) {
        let b = base64_decode(b.as_str().expect("_bytes is a string"));
        assert!(
            std::str::from_utf8(&b).is_err(),
            "{key}_bytes on a UTF-8 name: {j:?}"
        );
        let shown = j.str_field(key).expect("display string beside _bytes");
        assert_eq!(shown, String::from_utf8_lossy(&b), "{j:?}");
        return Some(b);
    }
    j.str_field(key).map(|s| s.as_bytes().to_vec())
}

fn p(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// One parsed `ls` text line: (size, mtime, path bytes, is dir, symlink target bytes).
#[track_caller]
fn ls_line(line: &str) -> (u64, i128, Vec<u8>, bool, Option<Vec<u8>>) {
    let mut it = line.splitn(3, ' ');
    let size = it
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("SIZE in {line:?}"));
    let mt = it
        .next()
        .unwrap_or("")
        .parse()
        .unwrap_or_else(|_| panic!("MTIME in {line:?}"));
    let rest = it.next().unwrap_or_else(|| panic!("no PATH in {line:?}"));
    let (path, target) = match rest.split_once(" -> ") {
        Some((a, b)) => (a, Some(unescape(b))),
        None => (rest, None),
    };
    let (path, dir) = match path.strip_suffix('/') {
        Some(x) => (x, true),
        None => (path, false),
    };
    (size, mt, unescape(path), dir, target)
}

const EVIL: &[u8] = b"evil\nferry: other: Permission denied";

/// Names that try to forge lines, hide bytes or fake separators.
fn nasty_names() -> Vec<Vec<u8>> {
    vec![
        EVIL.to_vec(),
        b"cr\rferry: x: y".to_vec(),
        b"esc\x1b[31mred".to_vec(),
        b"back\\nslash".to_vec(),
        b"bad\xffutf8".to_vec(),
        b"arrow -> fake".to_vec(),
        b"ends ->".to_vec(),
        b"back <- arrow".to_vec(),
        "c1\u{9b}31m and rlo\u{202e}txt.exe".as_bytes().to_vec(),
        "ünïcødé 日本".as_bytes().to_vec(),
        b"tab\tdel\x7f".to_vec(),
    ]
}

// ------------------------------------------------------------------------------------------
// 1. Text output: one line per entry, whatever the name
// ------------------------------------------------------------------------------------------

#[test]
fn ls_text_escapes_names_one_line_per_entry() {
    let t = tmpdir();
    let root = t.path().join("tree");
    let names = nasty_names();
    let sub: &[u8] = b"dir\n -> x\xfe";
    fs::create_dir_all(root.join(p(sub))).unwrap();
    for n in &names {
        fs::write(root.join(p(n)), n).unwrap();
        fs::write(root.join(p(sub)).join(p(n)), b"x").unwrap();
    }
    let link: &[u8] = b"link -> not\nthe target";
    let target: &[u8] = b"tar -> get\n1 2 ferry: t\xff";
    std::os::unix::fs::symlink(p(target), root.join(p(link))).unwrap();

    let r = ferry([OsString::from("ls"), root.clone().into()]);
    r.ok();
    let out = std::str::from_utf8(&r.stdout).expect("text output is UTF-8 (bad bytes escaped)");
    let mut seen = BTreeSet::new();
    for line in out.lines() {
        assert!(
            !line.bytes().any(|b| b < 0x20 || b == 0x7f),
            "raw control byte in {line:?}"
        );
        let (size, _, path, dir, tg) = ls_line(line);
        if path == link {
            assert_eq!(tg.as_deref(), Some(target), "{line:?}");
        } else {
            assert!(tg.is_none(), "{line:?} has a target");
        }
        if !dir && path != link {
            let data = fs::read(root.join(p(&path))).unwrap();
            assert_eq!(size, data.len() as u64, "{line:?}");
        }
        assert!(seen.insert(path), "entry listed twice: {line:?}");
    }
    let mut want: BTreeSet<Vec<u8>> = names.iter().cloned().collect();
    for n in &names {
        want.insert([sub, b"/", n].concat());
    }
    want.insert(sub.to_vec());
    want.insert(link.to_vec());
    assert_eq!(seen, want, "{r}");
    assert_eq!(out.lines().count(), want.len(), "{r}");
}

/// Lines of `-v` / `-n` output (`ACTION PATH`) decoded to (action, path bytes).
#[track_caller]
fn action_lines(r: &Run) -> Vec<(String, Vec<u8>)> {
    let out = std::str::from_utf8(&r.stdout).expect("action lines are UTF-8");
    out.lines()
        .map(|l| {
            assert!(!l.bytes().any(|b| b < 0x20 || b == 0x7f), "{l:?}");
            let (a, rest) = l.split_once(' ').unwrap_or_else(|| panic!("{l:?}"));
            (a.to_owned(), unescape(rest))
        })
        .collect()
}

#[test]
fn verbose_and_dry_run_lines_escape_names() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    let names = nasty_names();
    for n in &names {
        fs::write(src.join(p(n)), n).unwrap();
    }
    let want: BTreeSet<Vec<u8>> = names.iter().cloned().collect();
    let copied = |r: &Run| -> BTreeSet<Vec<u8>> {
        action_lines(r)
            .into_iter()
            .filter(|(a, _)| a == "copy")
            .map(|(_, p)| p)
            .collect()
    };
    let r = run_on("copy", &src, &dst, &["-n"]);
    r.ok();
    assert_eq!(copied(&r), want, "{r}");
    let r = run_on("copy", &src, &dst, &["-v"]);
    r.ok();
    assert_eq!(copied(&r), want, "{r}");
    assert_trees_equal(&src, &dst);
}

#[test]
fn error_and_skip_lines_cannot_be_forged() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    // copy never deletes: a DST directory where SRC has a file is an error on that path.
    fs::write(src.join(p(EVIL)), b"file").unwrap();
    fs::create_dir_all(dst.join(p(EVIL)).join("keep")).unwrap();
    let fifo_name: &[u8] = b"fifo\nferry: skipped other (x)";
    // A socket (skipped with a note); its listener is gone, the file stays.
    drop(std::os::unix::net::UnixListener::bind(src.join(p(fifo_name))).unwrap());
    let r = run_on("copy", &src, &dst, &[]);
    r.code_is(1);
    let err = std::str::from_utf8(&r.stderr).unwrap();
    assert!(
        !err.lines()
            .any(|l| l.starts_with("ferry: other") || l.starts_with("ferry: skipped other")),
        "a name forged a line\n{r}"
    );
    let errs: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ferry: ") && !l.starts_with("ferry: skipped"))
        .collect();
    assert_eq!(errs.len(), 1, "{r}");
    assert!(
        errs[0].contains("evil\\nferry: other: Permission denied: "),
        "{r}"
    );
    let skips: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ferry: skipped "))
        .collect();
    assert_eq!(skips.len(), 1, "{r}");
    assert!(
        unescape(skips[0]).starts_with(&[b"ferry: skipped ", fifo_name].concat()),
        "{r}"
    );
    // A refusal naming a path from the command line stays one line too.
    let r = ferry([
        OsString::from("copy"),
        src.join(p(b"gone\nferry: x: y")).into(),
        dst.into(),
    ]);
    r.code_is(2);
    assert_eq!(r.err().lines().count(), 1, "{r}");
}

#[test]
fn ls_error_line_escapes_the_path() {
    let t = tmpdir();
    let root = t.path().join("tree");
    let d = root.join(p(EVIL));
    fs::create_dir_all(&d).unwrap();
    chmod(&d, 0o000);
    // root reads a mode-000 directory: list as `nobody` then.
    let mut cmd = if is_root() {
        chmod(t.path(), 0o755);
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin());
        c
    } else {
        std::process::Command::new(bin())
    };
    let out = cmd.arg("ls").arg(&root).output().unwrap();
    chmod(&d, 0o755);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("ferry: ") && err.contains("evil\\nferry: other: Permission denied: "),
        "{err}"
    );
}

#[test]
fn bisync_lines_escape_names() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    let names = nasty_names();
    for n in &names {
        fs::write(a.join(p(n)), n).unwrap();
    }
    let args = |extra: &[&str]| {
        let mut v: Vec<OsString> = vec!["bisync".into(), "--journal".into(), j.clone().into()];
        v.extend(extra.iter().map(OsString::from));
        v.push(a.clone().into());
        v.push(b.clone().into());
        v
    };
    let r = ferry(args(&["-v"]));
    r.ok();
    let out = std::str::from_utf8(&r.stdout).unwrap();
    let mut got = BTreeSet::new();
    for l in out.lines() {
        assert!(!l.bytes().any(|b| b < 0x20 || b == 0x7f), "{l:?}");
        let mut it = l.splitn(3, ' ');
        let (act, side, path) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        if act == "copy" {
            assert_eq!(side, "B", "{l:?}");
            got.insert(unescape(path));
        }
    }
    assert_eq!(got, names.iter().cloned().collect(), "{r}");
    // A rename: `rename B NEW <- OLD`, split at the first ` <- `.
    let (old, new): (&[u8], &[u8]) = (b"arrow -> fake", b"new <- x\n");
    fs::rename(a.join(p(old)), a.join(p(new))).unwrap();
    let r = ferry(args(&["-v"]));
    r.ok();
    let line = r
        .out()
        .lines()
        .find(|l| l.starts_with("rename "))
        .unwrap_or_else(|| panic!("no rename line\n{r}"))
        .to_owned();
    let rest = line.strip_prefix("rename B ").unwrap();
    let (n, o) = rest.split_once(" <- ").unwrap();
    assert_eq!(
        (unescape(n), unescape(o)),
        (new.to_vec(), old.to_vec()),
        "{r}"
    );
}

// ------------------------------------------------------------------------------------------
// 2. --json: names that are not UTF-8 are lossless
// ------------------------------------------------------------------------------------------

#[test]
fn json_keeps_non_utf8_names_apart() {
    let t = tmpdir();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    fs::write(src.join(p(b"a\xff")), b"1").unwrap();
    fs::write(src.join(p(b"a\xfe")), b"22").unwrap();
    fs::write(src.join("plain"), b"3").unwrap();
    std::os::unix::fs::symlink(p(b"t\xfd"), src.join(p(b"l\xfc"))).unwrap();
    // ls --json
    let r = ferry([
        OsString::from("ls"),
        OsString::from("--json"),
        src.clone().into(),
    ]);
    r.ok();
    let mut got = BTreeSet::new();
    for j in json_lines(&r) {
        let path = name_of(&j, "path").unwrap();
        if path == b"l\xfc" {
            assert_eq!(
                name_of(&j, "target").as_deref(),
                Some(&b"t\xfd"[..]),
                "{j:?}"
            );
        }
        if path == b"plain" {
            assert!(j.get("path_bytes").is_none(), "{j:?}");
        }
        got.insert(path);
    }
    let want: BTreeSet<Vec<u8>> = [&b"a\xff"[..], b"a\xfe", b"plain", b"l\xfc"]
        .iter()
        .map(|x| x.to_vec())
        .collect();
    assert_eq!(got, want, "{r}");
    // copy --json: action records.
    let r = run_on("copy", &src, &dst, &["--json"]);
    r.ok();
    let lines = json_lines(&r);
    let copied: BTreeSet<Vec<u8>> = lines
        .iter()
        .filter(|j| matches!(j.str_field("type"), Some("copy" | "symlink")))
        .map(|j| name_of(j, "path").unwrap())
        .collect();
    assert_eq!(copied, want, "{r}");
    // An error record on a non-UTF-8 path (copy refuses to replace a directory by a file).
    fs::write(src.join(p(b"e\xff")), b"file").unwrap();
    fs::create_dir_all(dst.join(p(b"e\xff")).join("keep")).unwrap();
    let r = run_on("copy", &src, &dst, &["--json"]);
    r.code_is(1);
    let errs: Vec<Vec<u8>> = json_lines(&r)
        .iter()
        .filter(|j| j.str_field("type") == Some("error"))
        .map(|j| name_of(j, "path").unwrap())
        .collect();
    assert_eq!(errs.len(), 1, "{r}");
    assert!(errs[0].ends_with(b"e\xff"), "{r}");
}

#[test]
fn bisync_json_rename_and_conflict_names_are_lossless() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    fs::write(a.join(p(b"r\xff")), b"rename me").unwrap();
    fs::write(a.join(p(b"c\xfe.txt")), b"base").unwrap();
    let run = || {
        ferry([
            OsString::from("bisync"),
            "--json".into(),
            "--journal".into(),
            j.clone().into(),
            a.clone().into(),
            b.clone().into(),
        ])
    };
    run().ok();
    fs::rename(a.join(p(b"r\xff")), a.join(p(b"s\xfd"))).unwrap();
    let c: &[u8] = b"c\xfe.txt";
    fs::write(a.join(p(c)), b"edit on A").unwrap();
    fs::write(b.join(p(c)), b"edit on B, longer").unwrap();
    set_mtime(&a.join(p(c)), (1_700_000_000, 0));
    set_mtime(&b.join(p(c)), (1_700_000_100, 0));
    let r = run();
    r.ok();
    let lines = json_lines(&r);
    let rename = lines
        .iter()
        .find(|l| l.str_field("type") == Some("rename"))
        .unwrap_or_else(|| panic!("no rename record\n{r}"));
    assert_eq!(name_of(rename, "path").unwrap(), b"s\xfd", "{r}");
    assert_eq!(name_of(rename, "from").unwrap(), b"r\xff", "{r}");
    let conflict = lines
        .iter()
        .find(|l| l.str_field("type") == Some("conflict"))
        .unwrap_or_else(|| panic!("no conflict record\n{r}"));
    assert_eq!(name_of(conflict, "path").unwrap(), c, "{r}");
    let moved = name_of(conflict, "renamed_to").unwrap();
    assert!(
        moved.starts_with(b"c\xfe") && moved.ends_with(b".txt"),
        "{r}"
    );
    assert!(a.join(p(&moved)).exists(), "{r}");
}

// ------------------------------------------------------------------------------------------
// 3. Every byte 1..255 round-trips through `ls --json` and text `ls`
// ------------------------------------------------------------------------------------------

/// Names holding every byte but NUL and '/': each alone between two letters, all of them in
/// one 254-byte name, a valid multi-byte name, and a directory with odd bytes holding some.
fn every_byte_tree(root: &Path) -> BTreeSet<Vec<u8>> {
    let mut want = BTreeSet::new();
    let bytes: Vec<u8> = (1..=255u8).filter(|&b| b != b'/').collect();
    fs::create_dir_all(root).unwrap();
    let mut add = |rel: Vec<u8>, dir: bool| {
        let path = root.join(p(&rel));
        if dir {
            fs::create_dir(&path).unwrap();
        } else {
            fs::write(&path, &rel).unwrap();
        }
        want.insert(rel);
    };
    for &b in &bytes {
        add(vec![b'x', b, b'y'], false);
        if b != b'.' {
            add(vec![b], false);
        }
    }
    add(bytes.clone(), false);
    add("é日本😀".as_bytes().to_vec(), false);
    let d: Vec<u8> = b"d\x01\n\\\xff\x80 -> ".to_vec();
    add(d.clone(), true);
    for &b in &[b'\n', b'\\', 0xff, 0x7f, b'>'] {
        add([&d[..], b"/", &[b'z', b][..]].concat(), false);
    }
    want
}

#[test]
fn every_byte_round_trips_through_ls_json_and_text() {
    let t = tmpdir();
    let root = t.path().join("bytes");
    let want = every_byte_tree(&root);

    let r = ferry([
        OsString::from("ls"),
        OsString::from("--json"),
        root.clone().into(),
    ]);
    r.ok();
    let got: Vec<Vec<u8>> = json_lines(&r)
        .iter()
        .map(|j| name_of(j, "path").unwrap())
        .collect();
    assert_eq!(got.len(), want.len(), "{r}");
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), want);

    let r = ferry([OsString::from("ls"), root.clone().into()]);
    r.ok();
    let out = std::str::from_utf8(&r.stdout).expect("text ls is UTF-8");
    let got: Vec<Vec<u8>> = out
        .lines()
        .map(|l| {
            assert!(!l.bytes().any(|b| b < 0x20 || b == 0x7f), "{l:?}");
            let (_, _, path, dir, target) = ls_line(l);
            assert!(target.is_none(), "{l:?}");
            assert_eq!(dir, root.join(p(&path)).is_dir(), "{l:?}");
            path
        })
        .collect();
    // One line per entry: as many lines as entries, each decoding to one of them.
    assert_eq!(got.len(), want.len(), "{r}");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want);
}

// ------------------------------------------------------------------------------------------
// 4. A refused --json run still ends with a JSON summary
// ------------------------------------------------------------------------------------------

/// The summary of a refused `--json` run: exit 2, all stdout lines JSON, the last one a
/// summary with `"refused"` holding the reason (also on stderr).
#[track_caller]
fn refused(r: &Run) -> String {
    r.code_is(2);
    let lines = json_lines(r);
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no JSON summary\n{r}"));
    assert_eq!(last.str_field("type"), Some("summary"), "{r}");
    for k in ["entries_scanned", "files_copied", "files_deleted", "errors"] {
        assert!(last.get(k).and_then(Json::as_u64).is_some(), "{k}\n{r}");
    }
    let why = last
        .str_field("refused")
        .unwrap_or_else(|| panic!("summary lacks refused\n{r}"))
        .to_owned();
    assert!(!why.is_empty() && r.err().contains(&why), "{r}");
    why
}

#[test]
fn refused_json_runs_print_a_summary_with_the_reason() {
    let t = tmpdir();
    let src = t.path().join("src");
    write(&src, "f", b"data");
    for cmd in ["copy", "sync"] {
        // Missing SRC.
        let r = run_on(
            cmd,
            &t.path().join("nope"),
            &t.path().join("d"),
            &["--json"],
        );
        assert!(refused(&r).contains("No such file"), "{r}");
        // DST inside SRC, dry run too.
        let r = run_on(cmd, &src, &src.join("in"), &["--json", "-n"]);
        refused(&r);
        let last = json_lines(&r).pop().unwrap();
        assert_eq!(last.get("dry_run"), Some(&Json::Bool(true)), "{r}");
        assert_eq!(summary(&r).files_copied, 0);
    }
    // Without --json: no JSON on stdout.
    let r = run_on("copy", &t.path().join("nope"), &t.path().join("d"), &[]);
    r.code_is(2);
    assert!(r.stdout.is_empty(), "{r}");
}

#[test]
fn refused_bisync_json_prints_a_summary_with_the_reason() {
    let t = tmpdir();
    let (a, b, j) = (t.path().join("a"), t.path().join("b"), t.path().join("j"));
    for i in 0..4 {
        write(&a, format!("f{i}"), b"x");
    }
    fs::create_dir(&b).unwrap();
    let run = |extra: &[&str]| {
        let mut v: Vec<OsString> = vec!["bisync".into(), "--journal".into(), j.clone().into()];
        v.extend(extra.iter().map(OsString::from));
        v.push(a.clone().into());
        v.push(b.clone().into());
        ferry(v)
    };
    run(&[]).ok();
    // Deletion limit.
    for i in 0..3 {
        fs::remove_file(a.join(format!("f{i}"))).unwrap();
    }
    let r = run(&["--json"]);
    refused(&r);
    let last = json_lines(&r).pop().unwrap();
    assert_eq!(
        last.get("files_deleted").and_then(Json::as_u64),
        Some(0),
        "{r}"
    );
    assert!(b.join("f0").exists());
    // Lock held by another process (flock(1) holding it while `sleep` runs).
    let mut lock: OsString = j.clone().into();
    lock.push(".lock");
    let mut holder = std::process::Command::new("flock")
        .arg("--no-fork")
        .arg("-x")
        .arg(&lock)
        .arg("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    // Until flock(1) has it, a dry run (which takes the lock too) passes.
    let mut r = run(&["--json", "--force", "-n"]);
    for _ in 0..200 {
        if r.code != Some(0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        r = run(&["--json", "--force", "-n"]);
    }
    holder.kill().unwrap();
    let _ = holder.wait();
    assert!(refused(&r).contains("another bisync"), "{r}");
}
