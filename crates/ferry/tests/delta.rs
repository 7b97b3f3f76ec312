//! Delta transfers end to end: `--delta` between local trees, `--whole-file`,
//! and push, pull, bisync and a kill -9 mid-delta over ssh against the test
//! sshd (`scripts/sshd`: `FERRY_TEST_SSH_*`; those tests skip with a line
//! saying so without it). The `--json` figures are asserted: a small edit
//! of a big file sends a few blocks.

mod util;

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::time::Duration;

use util::*;

/// (the -e command, the host alias), or why the tests skip.
fn server() -> Option<(String, String)> {
    let v = |k: &str| std::env::var(format!("FERRY_TEST_SSH_{k}")).ok();
    match (v("RSH"), v("HOST")) {
        (Some(r), Some(h)) => Some((r, h)),
        _ => {
            eprintln!("skipped: FERRY_TEST_SSH_* not set (scripts/test starts sshd)");
            None
        }
    }
}

/// `host:path` of a local path (the server is this machine).
fn at(host: &str, p: &Path) -> OsString {
    let mut s = OsString::from(format!("{host}:"));
    s.push(p.as_os_str());
    s
}

/// ferry with the test server's -e and this build as the remote ferry.
fn remote_args(rsh: &str, args: &[&OsStr]) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec![args[0].into(), "-e".into(), rsh.into()];
    a.push("--remote-ferry".into());
    a.push(bin());
    a.extend(args[1..].iter().map(|s| s.to_os_string()));
    a
}

/// The `--json` summary line's fields.
fn summary(r: &Run) -> serde_json::Value {
    let line = r
        .out()
        .lines()
        .rev()
        .find(|l| l.contains("\"type\":\"summary\""))
        .unwrap_or_else(|| panic!("no summary\n{r}"))
        .to_owned();
    serde_json::from_str(&line).unwrap()
}

fn field(s: &serde_json::Value, k: &str) -> u64 {
    s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"))
}

/// `data` with a few bytes changed at 20 scattered places, 5,000 bytes
/// inserted in the middle and 100,000 appended.
fn edited(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    for k in 0..20 {
        let i = k * (v.len() / 20) + 333;
        v[i] ^= 0x5a;
    }
    let mid = v.len() / 2;
    v.splice(mid..mid, gen_bytes(5000, 99));
    v.extend_from_slice(&gen_bytes(100_000, 98));
    v
}

/// A delta of [`edited`] sent few bytes: each change costs about a block
/// (`block`), the appended and inserted bytes themselves, and the
/// signature and ops.
fn assert_small_delta(s: &serde_json::Value, size: usize, block: u64) {
    assert_eq!(field(s, "delta_files"), 1, "{s}");
    assert_eq!(field(s, "delta_fallbacks"), 0, "{s}");
    let literal = field(s, "literal_bytes");
    assert!(literal <= 22 * 2 * block + 105_000, "{s}");
    assert_eq!(literal + field(s, "matched_bytes"), size as u64, "{s}");
    let sig = (size as u64 / block + 1) * 8 + 64;
    assert!(field(s, "wire_bytes") <= literal + sig + 4096, "{s}");
    assert_eq!(field(s, "bytes_copied"), size as u64, "{s}");
}

#[test]
fn local_delta_only_when_asked_and_whole_file_sends_whole() {
    let d = tmpdir();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = gen_bytes(8 << 20, 1);
    write(&src, "f", &data);
    ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
    let new = edited(&data);
    write(&src, "f", &new);
    let r = ferry(
        ["copy", "--delta", "--json"]
            .map(OsStr::new)
            .into_iter()
            .chain([src.as_os_str(), dst.as_os_str()]),
    );
    r.ok();
    assert_small_delta(&summary(&r), new.len(), 2896);
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
    // Without --delta, local trees copy whole; -W never sends a delta.
    let newer = edited(&new);
    write(&src, "f", &newer);
    let r = ferry([
        "copy".as_ref(),
        "--json".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ]);
    let s = summary(r.ok());
    assert_eq!(
        (field(&s, "delta_files"), field(&s, "wire_bytes")),
        (0, newer.len() as u64),
        "{s}"
    );
    write(&src, "f", &new);
    let r = ferry(
        ["copy", "--delta", "-W", "--json"]
            .map(OsStr::new)
            .into_iter()
            .chain([src.as_os_str(), dst.as_os_str()]),
    );
    r.code_is(2);
    let r = ferry(
        ["copy", "--whole-file", "--json"]
            .map(OsStr::new)
            .into_iter()
            .chain([src.as_os_str(), dst.as_os_str()]),
    );
    let s = summary(r.ok());
    assert!(s.get("delta_files").is_none(), "{s}");
    assert_eq!(field(&s, "bytes_copied"), new.len() as u64);
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
}

#[test]
fn pushed_and_pulled_by_delta_over_ssh() {
    let Some((rsh, host)) = server() else { return };
    let d = tmpdir();
    let (src, dst, back) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("back"),
    );
    let data = gen_bytes(16 << 20, 2);
    write(&src, "f", &data);
    write(&back, "f", &data);
    let push = |extra: &[&str]| {
        let mut a: Vec<&OsStr> = vec!["copy".as_ref(), "--json".as_ref()];
        a.extend(extra.iter().map(OsStr::new));
        let to = at(&host, &dst);
        a.extend([src.as_os_str(), to.as_os_str()]);
        ferry(remote_args(&rsh, &a))
    };
    push(&[]).ok();
    let new = edited(&data);
    write(&src, "f", &new);
    let r = push(&[]);
    assert_small_delta(&summary(r.ok()), new.len(), 4096);
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
    // Pull: the local old copy is signed here, the ops made there.
    let from = at(&host, &dst);
    let r = ferry(remote_args(
        &rsh,
        &[
            "copy".as_ref(),
            "--json".as_ref(),
            from.as_os_str(),
            back.as_os_str(),
        ],
    ));
    assert_small_delta(&summary(r.ok()), new.len(), 4096);
    assert!(std::fs::read(back.join("f")).unwrap() == new);
    // -W over ssh: whole.
    write(&src, "f", &data);
    let s = summary(push(&["-W"]).ok());
    assert!(s.get("delta_files").is_none(), "{s}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
}

#[test]
fn bisync_over_ssh_updates_by_delta() {
    let Some((rsh, host)) = server() else { return };
    let d = tmpdir();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let data = gen_bytes(4 << 20, 3);
    write(&a, "big", &data);
    let j = d.path().join("journal.sqlite");
    let bis = || {
        let rb = at(&host, &b);
        let args: Vec<&OsStr> = vec![
            "bisync".as_ref(),
            "--json".as_ref(),
            "--journal".as_ref(),
            j.as_os_str(),
            a.as_os_str(),
            rb.as_os_str(),
        ];
        ferry(remote_args(&rsh, &args))
    };
    bis().ok();
    let new = edited(&data);
    write(&a, "big", &new);
    let s = summary(bis().ok());
    assert_small_delta(&s, new.len(), 2048);
    assert!(std::fs::read(b.join("big")).unwrap() == new);
}

/// ferry killed (-9) while a big file's delta is on its way to the remote:
/// the remote's old file is intact, and a rerun completes it and leaves no
/// temporary.
#[test]
fn push_killed_mid_delta_keeps_the_old_file() {
    let Some((rsh, host)) = server() else { return };
    let d = tmpdir();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = gen_bytes(32 << 20, 4);
    write(&src, "f", &data);
    write(&dst, "f", &data);
    // The second half new: 16 MiB of literals, paced to take seconds.
    let mut new = data.clone();
    new[16 << 20..].copy_from_slice(&gen_bytes(16 << 20, 5));
    write(&src, "f", &new);
    let to = at(&host, &dst);
    let mut child = spawn_ferry(remote_args(
        &rsh,
        &[
            "copy".as_ref(),
            "--bwlimit".as_ref(),
            "4M".as_ref(),
            src.as_os_str(),
            to.as_os_str(),
        ],
    ));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the copy ended too soon"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        std::fs::read(dst.join("f")).unwrap() == data,
        "the old file changed"
    );
    let r = ferry(remote_args(
        &rsh,
        &[
            "copy".as_ref(),
            "--json".as_ref(),
            src.as_os_str(),
            to.as_os_str(),
        ],
    ));
    let s = summary(r.ok());
    assert_eq!(field(&s, "delta_files"), 1, "{s}");
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
    let mut left = Vec::new();
    for _ in 0..100 {
        left = find_prefixed(&dst, b".ferry-");
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(left.is_empty(), "{left:?}");
}
