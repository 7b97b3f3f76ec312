//! Delta transfers end to end: `--delta` between local trees, `--whole-file`,
//! and push, pull, bisync and a kill -9 mid-delta over ssh against the test
//! sshd (`scripts/sshd`: `FERRY_TEST_SSH_*`; those tests skip with a line
//! saying so without it). The `--json` figures are asserted: a small edit
//! of a big file sends a few blocks.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::time::Duration;

use crate::util::ssh::dying_ferry;
use crate::util::*;

/// (the -e command, the host alias), or why the tests skip.
fn server() -> Option<(String, String)> {
    let v = |k: &str| std::env::var(format!("FERRY_TEST_SSH_{k}")).ok();
    match (v("RSH"), v("HOST")) {
        (Some(r), Some(h)) => Some((r, h)),
        _ => {
            crate::util::skip(&"FERRY_TEST_SSH_* not set (scripts/test starts sshd)");
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
    // Killed once the delta's literals are on their way (1 MiB written to
    // ssh: the remote's signatures came first), not after a fixed time.
    wait_written(&mut child, 1 << 20);
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

/// ferry with `args` and the environment `env` added.
fn ferry_env(args: &[&OsStr], env: &[(&str, String)]) -> Run {
    let mut c = std::process::Command::new(bin());
    c.args(args).stdin(std::process::Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    run_within(c, Duration::from_secs(600))
}

/// The append path's threshold lowered for tests (the decision is the
/// client's, whichever end receives).
fn small_min() -> (&'static str, String) {
    ("FERRY_TEST_APPEND_MIN", (1u64 << 20).to_string())
}

fn ino(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().ino()
}

/// The `--json` figures of an append in place of `tail` bytes to a file
/// of `old` bytes.
fn assert_appended(s: &serde_json::Value, old: usize, tail: usize) {
    assert_patched(s, old + tail, tail as u64);
}

/// The `--json` figures of a patch in place of a file to `size` bytes
/// that sent `literal` bytes: the rest matched, and on the wire the
/// literal bytes and the block list (8 bytes per 8 KiB block, the test
/// files' block) with a little more.
fn assert_patched(s: &serde_json::Value, size: usize, literal: u64) {
    assert_eq!(field(s, "delta_files"), 1, "{s}");
    assert_eq!(field(s, "delta_fallbacks"), 0, "{s}");
    assert_eq!(field(s, "literal_bytes"), literal, "{s}");
    assert_eq!(field(s, "matched_bytes"), size as u64 - literal, "{s}");
    let list = (size as u64 / 8192 + 1) * 8;
    assert!(field(s, "wire_bytes") <= literal + list + 4096, "{s}");
    assert_eq!(field(s, "bytes_copied"), size as u64, "{s}");
}

fn no_reserved_left(root: &Path) {
    let left = find_prefixed(root, b".ferry-");
    assert!(left.is_empty(), "{left:?}");
}

/// Wait until `child` has written `bytes` (its `wchar`: to its pipes and
/// files), or has ended.
fn wait_written(child: &mut std::process::Child, bytes: u64) {
    let io = format!("/proc/{}/io", child.id());
    let written = || {
        std::fs::read_to_string(&io).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("wchar: "))
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
    };
    let end = std::time::Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() && written().unwrap_or(0) < bytes {
        assert!(
            std::time::Instant::now() < end,
            "{bytes} bytes never written"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn local_append_in_place_and_the_ways_around_it() {
    let d = tmpdir();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = gen_bytes(4 << 20, 11);
    write(&src, "f", &data);
    ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
    let copy = |env: &[(&str, String)]| {
        let a = ["copy", "--delta", "--json"].map(OsStr::new);
        let mut a: Vec<&OsStr> = a.to_vec();
        a.extend([src.as_os_str(), dst.as_os_str()]);
        ferry_env(&a, env)
    };
    // Grown at its end: appended in place (same inode), the tail sent.
    let before = ino(&dst.join("f"));
    let mut new = data.clone();
    new.extend_from_slice(&gen_bytes(300_000, 12));
    write(&src, "f", &new);
    let r = copy(&[small_min()]);
    assert_appended(&summary(r.ok()), data.len(), 300_000);
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
    assert_eq!(ino(&dst.join("f")), before, "not appended in place");
    assert_eq!(get_mtime(&dst.join("f")), get_mtime(&src.join("f")));
    no_reserved_left(&dst);
    // The first bytes differ too: that block is patched in place and the
    // tail appended.
    let mut newer = new.clone();
    newer[1000] ^= 0xff;
    newer.extend_from_slice(&gen_bytes(200_000, 13));
    write(&src, "f", &newer);
    let s = summary(copy(&[small_min()]).ok());
    assert_patched(&s, newer.len(), 8192 + 200_000);
    assert!(std::fs::read(dst.join("f")).unwrap() == newer);
    assert_eq!(ino(&dst.join("f")), before, "not patched in place");
    // A destination with another hard link is never written in place.
    let other = d.path().join("other");
    std::fs::hard_link(dst.join("f"), &other).unwrap();
    let mut grown = newer.clone();
    grown.extend_from_slice(&gen_bytes(100_000, 14));
    write(&src, "f", &grown);
    let s = summary(copy(&[small_min()]).ok());
    assert_eq!(field(&s, "delta_files"), 1, "{s}");
    assert!(std::fs::read(dst.join("f")).unwrap() == grown);
    assert!(
        std::fs::read(&other).unwrap() == newer,
        "the other link changed"
    );
    // Under the threshold: the copy-based delta (a new file), even with
    // the test hook that would kill an append half way.
    let at = ino(&dst.join("f"));
    let mut more = grown.clone();
    more.extend_from_slice(&gen_bytes(100_000, 15));
    write(&src, "f", &more);
    let die = ("FERRY_TEST_APPEND_DIE", "1".to_string());
    let s = summary(copy(&[die]).ok());
    assert_eq!(field(&s, "delta_files"), 1, "{s}");
    assert!(std::fs::read(dst.join("f")).unwrap() == more);
    assert_ne!(
        ino(&dst.join("f")),
        at,
        "appended in place under the threshold"
    );
    no_reserved_left(&dst);
}

/// A run killed half way through an append's tail (the test hook kills
/// the receiving process): the next run that lists the directory rolls
/// the file back (old size and mtime) before reading it, and a copy
/// completes; no reserved name is left.
#[test]
fn append_killed_half_way_is_rolled_back_by_the_next_run() {
    let d = tmpdir();
    let (src, dst, out) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("out"),
    );
    let data = gen_bytes(3 << 20, 21);
    write(&src, "f", &data);
    ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
    let old_mtime = get_mtime(&dst.join("f"));
    let tail = 3 << 20;
    let mut new = data.clone();
    new.extend_from_slice(&gen_bytes(tail, 22));
    write(&src, "f", &new);
    let a: Vec<&OsStr> = vec![
        "copy".as_ref(),
        "--delta".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ];
    let die = ("FERRY_TEST_APPEND_DIE", (tail / 2).to_string());
    let r = ferry_env(&a, &[small_min(), die]);
    assert!(r.code.is_none(), "not killed\n{r}");
    let len = std::fs::metadata(dst.join("f")).unwrap().len() as usize;
    assert!(len > data.len() && len < new.len(), "{len}");
    assert_eq!(find_prefixed(&dst, b".ferry-undo-").len(), 1);
    // A run reading the half-appended tree sees the old file.
    ferry(["copy".as_ref(), dst.as_os_str(), out.as_os_str()]).ok();
    assert!(std::fs::read(out.join("f")).unwrap() == data);
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    assert_eq!(get_mtime(&dst.join("f")), old_mtime);
    no_reserved_left(&dst);
    no_reserved_left(&out);
    // Killed again, then the next copy itself rolls back and appends.
    let die = ("FERRY_TEST_APPEND_DIE", (tail / 2).to_string());
    assert!(ferry_env(&a, &[small_min(), die]).code.is_none());
    let before = ino(&dst.join("f"));
    let mut a = a.clone();
    a.insert(1, "--json".as_ref());
    let r = ferry_env(&a, &[small_min()]);
    assert_appended(&summary(r.ok()), data.len(), tail);
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
    assert_eq!(ino(&dst.join("f")), before);
    no_reserved_left(&dst);
}

/// Local `--delta` killed (-9) mid-delta under the append threshold: the
/// old file is intact (the copy-based path writes a new temporary).
#[test]
fn local_delta_killed_under_the_threshold_keeps_the_old_file() {
    let d = tmpdir();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = gen_bytes(16 << 20, 31);
    write(&src, "f", &data);
    write(&dst, "f", &data);
    let mut new = data.clone();
    new.extend_from_slice(&gen_bytes(16 << 20, 32));
    write(&src, "f", &new);
    let mut child = spawn_ferry([
        "copy".as_ref(),
        "--delta".as_ref(),
        "--bwlimit".as_ref(),
        "4M".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ]);
    // Killed once the new temporary is being written (1 MiB of it).
    wait_written(&mut child, 1 << 20);
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
    ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
    no_reserved_left(&dst);
}

#[test]
fn append_pushed_and_pulled_over_ssh() {
    let Some((rsh, host)) = server() else { return };
    let d = tmpdir();
    let (src, dst, back) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("back"),
    );
    let data = gen_bytes(4 << 20, 41);
    write(&src, "f", &data);
    write(&back, "f", &data);
    let to = at(&host, &dst);
    let push = || {
        let a: Vec<&OsStr> = vec![
            "copy".as_ref(),
            "--json".as_ref(),
            src.as_os_str(),
            to.as_os_str(),
        ];
        ferry_env(
            &remote_args(&rsh, &a)
                .iter()
                .map(|s| s.as_os_str())
                .collect::<Vec<_>>(),
            &[small_min()],
        )
    };
    push().ok();
    let before = ino(&dst.join("f"));
    let mut new = data.clone();
    new.extend_from_slice(&gen_bytes(500_000, 42));
    write(&src, "f", &new);
    assert_appended(&summary(push().ok()), data.len(), 500_000);
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
    assert_eq!(ino(&dst.join("f")), before, "not appended in place");
    no_reserved_left(&dst);
    // Pull: the local side receives.
    let from = at(&host, &dst);
    let pull = |env: &[(&str, String)]| {
        let a: Vec<&OsStr> = vec![
            "copy".as_ref(),
            "--json".as_ref(),
            from.as_os_str(),
            back.as_os_str(),
        ];
        ferry_env(
            &remote_args(&rsh, &a)
                .iter()
                .map(|s| s.as_os_str())
                .collect::<Vec<_>>(),
            env,
        )
    };
    let before = ino(&back.join("f"));
    assert_appended(&summary(pull(&[small_min()]).ok()), data.len(), 500_000);
    assert!(std::fs::read(back.join("f")).unwrap() == new);
    assert_eq!(ino(&back.join("f")), before, "not appended in place");
    // A pull killed half way: rolled back, then completed.
    let mut newer = new.clone();
    newer.extend_from_slice(&gen_bytes(2 << 20, 43));
    write(&src, "f", &newer);
    push().ok();
    let die = ("FERRY_TEST_APPEND_DIE", (1u64 << 20).to_string());
    assert!(pull(&[small_min(), die]).code.is_none());
    assert_eq!(find_prefixed(&back, b".ferry-undo-").len(), 1);
    assert_appended(&summary(pull(&[small_min()]).ok()), new.len(), 2 << 20);
    assert!(std::fs::read(back.join("f")).unwrap() == newer);
    no_reserved_left(&back);
    // The first bytes differ: that block patched in place, pushed.
    let mut other = newer.clone();
    other[5] ^= 1;
    other.extend_from_slice(&gen_bytes(10_000, 44));
    write(&src, "f", &other);
    let s = summary(push().ok());
    assert_patched(&s, other.len(), 8192 + 10_000);
    assert!(std::fs::read(dst.join("f")).unwrap() == other);
    no_reserved_left(&dst);
}

/// The remote end of an append push dies half way through the tail (the
/// remote ferry is a wrapper that sets the test hook): one line, not a
/// success; a run listing the remote directory sees the old file (the
/// record rolled back there), and the next push appends and completes.
#[test]
fn remote_end_killed_mid_append_is_rolled_back_there() {
    let Some((rsh, host)) = server() else { return };
    let d = tmpdir();
    let (src, dst, look) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("look"),
    );
    let data = gen_bytes(3 << 20, 51);
    write(&src, "f", &data);
    let to = at(&host, &dst);
    let tail = 2 << 20;
    let dying = dying_ferry(d.path(), tail as u64 / 2);
    let push = |remote: &OsStr| push_with(&rsh, remote, &src, &to);
    push(&bin()).ok();
    let old_mtime = get_mtime(&dst.join("f"));
    let mut new = data.clone();
    new.extend_from_slice(&gen_bytes(tail, 52));
    write(&src, "f", &new);
    let r = push(dying.as_os_str());
    assert!(
        r.code.is_some_and(|c| c != 0),
        "the remote died: not a success\n{r}"
    );
    let len = std::fs::metadata(dst.join("f")).unwrap().len() as usize;
    assert!(
        len > data.len() && len < new.len(),
        "half appended: {len}\n{r}"
    );
    assert_eq!(find_prefixed(&dst, b".ferry-undo-").len(), 1);
    // A pull of the remote directory lists it there: the old file.
    list_there(&rsh, &host, &dst, &look);
    assert!(std::fs::read(look.join("f")).unwrap() == data);
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    assert_eq!(get_mtime(&dst.join("f")), old_mtime);
    no_reserved_left(&dst);
    // The next push appends in place and completes.
    let before = ino(&dst.join("f"));
    assert_appended(&summary(push(&bin()).ok()), data.len(), tail);
    assert!(std::fs::read(dst.join("f")).unwrap() == new);
    assert_eq!(ino(&dst.join("f")), before);
    no_reserved_left(&dst);
}

/// `copy --json` of `src` to `to` over `rsh` with `remote` as the remote
/// ferry (in-place patches from 1 MiB up).
fn push_with(rsh: &str, remote: &OsStr, src: &Path, to: &OsStr) -> Run {
    let a: Vec<&OsStr> = vec![
        "copy".as_ref(),
        "--json".as_ref(),
        "-e".as_ref(),
        rsh.as_ref(),
        "--remote-ferry".as_ref(),
        remote,
        src.as_os_str(),
        to,
    ];
    ferry_env(&a, &[small_min()])
}

/// A pull of the remote `dir` into `look`: a listing of `dir` there.
fn list_there(rsh: &str, host: &str, dir: &Path, look: &Path) {
    let from = at(host, dir);
    let a: Vec<&OsStr> = vec!["copy".as_ref(), from.as_os_str(), look.as_os_str()];
    ferry_env(
        &remote_args(rsh, &a)
            .iter()
            .map(|s| s.as_os_str())
            .collect::<Vec<_>>(),
        &[],
    )
    .ok();
}

/// `data` with `n` edits of `len` bytes at fixed offsets spread over it
/// (same size), and the bytes of the 8 KiB blocks they touch.
fn scattered(data: &[u8], n: usize, len: usize) -> (Vec<u8>, u64) {
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
    (v, blocks.len() as u64 * 8192)
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn set_mode(p: &Path, m: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// The destination of `f` is the source's: bytes, mtime and mode.
fn assert_same(a: &Path, b: &Path) {
    assert!(std::fs::read(a).unwrap() == std::fs::read(b).unwrap());
    assert_eq!(get_mtime(a), get_mtime(b));
    assert_eq!(mode(a), mode(b));
}

/// Scattered edits at fixed offsets (same size), locally with `--delta`:
/// the blocks they touch are written in place (same inode), with mtime and
/// mode; with a grown tail too; too many differing blocks go the normal
/// delta way (a new file); a hard-linked destination is never written in
/// place.
#[test]
fn scattered_edits_patched_in_place_locally() {
    let d = tmpdir();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = gen_bytes(4 << 20, 61);
    write(&src, "f", &data);
    ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
    let copy = || {
        let a = ["copy", "--delta", "--json"].map(OsStr::new);
        let mut a: Vec<&OsStr> = a.to_vec();
        a.extend([src.as_os_str(), dst.as_os_str()]);
        ferry_env(&a, &[small_min()])
    };
    let before = ino(&dst.join("f"));
    let (new, literal) = scattered(&data, 10, 4096);
    write(&src, "f", &new);
    set_mode(&src.join("f"), 0o600);
    assert_patched(&summary(copy().ok()), new.len(), literal);
    assert_same(&src.join("f"), &dst.join("f"));
    assert_eq!(ino(&dst.join("f")), before, "not patched in place");
    no_reserved_left(&dst);
    // Patches and a tail together.
    let (mut newer, literal) = scattered(&new, 7, 100);
    newer.extend_from_slice(&gen_bytes(123_457, 62));
    write(&src, "f", &newer);
    assert_patched(&summary(copy().ok()), newer.len(), literal + 123_457);
    assert_same(&src.join("f"), &dst.join("f"));
    assert_eq!(ino(&dst.join("f")), before, "not patched in place");
    // Too many blocks differ (more than an eighth of the file): the
    // normal delta, into a new file.
    let (many, _) = scattered(&newer, 200, 10);
    write(&src, "f", &many);
    let s = summary(copy().ok());
    assert_eq!(field(&s, "delta_files"), 1, "{s}");
    assert_eq!(field(&s, "delta_fallbacks"), 0, "{s}");
    assert_same(&src.join("f"), &dst.join("f"));
    assert_ne!(ino(&dst.join("f")), before, "patched in place");
    no_reserved_left(&dst);
    // A destination with another hard link is left alone.
    let other = d.path().join("other");
    std::fs::hard_link(dst.join("f"), &other).unwrap();
    let (last, _) = scattered(&many, 3, 10);
    write(&src, "f", &last);
    let s = summary(copy().ok());
    assert_eq!(field(&s, "delta_files"), 1, "{s}");
    assert_same(&src.join("f"), &dst.join("f"));
    assert!(
        std::fs::read(&other).unwrap() == many,
        "the other link changed"
    );
    no_reserved_left(&dst);
}

/// A run killed half way through the blocks of a patch in place (the test
/// hook kills the receiving process): the next listing of the directory
/// puts the old bytes back with the old mtime, and a later copy
/// completes; no reserved name is left.
#[test]
fn patch_killed_half_way_is_rolled_back_by_the_next_listing() {
    let d = tmpdir();
    let (src, dst, out) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("out"),
    );
    let data = gen_bytes(4 << 20, 71);
    write(&src, "f", &data);
    ferry(["copy".as_ref(), src.as_os_str(), dst.as_os_str()]).ok();
    let old_mtime = get_mtime(&dst.join("f"));
    let (mut new, literal) = scattered(&data, 12, 3000);
    new.extend_from_slice(&gen_bytes(50_000, 72));
    write(&src, "f", &new);
    let a: Vec<&OsStr> = vec![
        "copy".as_ref(),
        "--delta".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ];
    let die = ("FERRY_TEST_APPEND_DIE", (literal / 2).to_string());
    let r = ferry_env(&a, &[small_min(), die]);
    assert!(r.code.is_none(), "not killed\n{r}");
    assert!(
        std::fs::read(dst.join("f")).unwrap() != data,
        "nothing written"
    );
    assert_eq!(find_prefixed(&dst, b".ferry-undo-").len(), 1);
    // A run reading the half-patched tree sees the old file.
    ferry(["copy".as_ref(), dst.as_os_str(), out.as_os_str()]).ok();
    assert!(std::fs::read(out.join("f")).unwrap() == data);
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    assert_eq!(get_mtime(&dst.join("f")), old_mtime);
    no_reserved_left(&dst);
    // Killed again, then the next copy itself rolls back and patches.
    let die = ("FERRY_TEST_APPEND_DIE", (literal / 3).to_string());
    assert!(ferry_env(&a, &[small_min(), die]).code.is_none());
    let before = ino(&dst.join("f"));
    let mut a = a.clone();
    a.insert(1, "--json".as_ref());
    let r = ferry_env(&a, &[small_min()]);
    assert_patched(&summary(r.ok()), new.len(), literal + 50_000);
    assert_same(&src.join("f"), &dst.join("f"));
    assert_eq!(ino(&dst.join("f")), before);
    no_reserved_left(&dst);
}

/// Scattered edits pushed and pulled over ssh: patched in place at the
/// receiving end (the remote one, then the local one), with mtime and
/// mode; a pull killed half way is rolled back by the next listing there
/// and completed by the next pull.
#[test]
fn scattered_edits_patched_in_place_over_ssh() {
    let Some((rsh, host)) = server() else { return };
    let d = tmpdir();
    let (src, dst, back) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("back"),
    );
    let data = gen_bytes(4 << 20, 81);
    write(&src, "f", &data);
    write(&back, "f", &data);
    let to = at(&host, &dst);
    let from = at(&host, &dst);
    let run = |a: Vec<&OsStr>, env: &[(&str, String)]| {
        ferry_env(
            &remote_args(&rsh, &a)
                .iter()
                .map(|s| s.as_os_str())
                .collect::<Vec<_>>(),
            env,
        )
    };
    let push = || {
        let a = vec![
            "copy".as_ref(),
            "--json".as_ref(),
            src.as_os_str(),
            to.as_os_str(),
        ];
        run(a, &[small_min()])
    };
    let pull = |env: &[(&str, String)]| {
        let a = vec![
            "copy".as_ref(),
            "--json".as_ref(),
            from.as_os_str(),
            back.as_os_str(),
        ];
        run(a, env)
    };
    push().ok();
    let before = ino(&dst.join("f"));
    let (mut new, literal) = scattered(&data, 9, 2000);
    new.extend_from_slice(&gen_bytes(77_777, 82));
    write(&src, "f", &new);
    set_mode(&src.join("f"), 0o640);
    assert_patched(&summary(push().ok()), new.len(), literal + 77_777);
    assert_same(&src.join("f"), &dst.join("f"));
    assert_eq!(ino(&dst.join("f")), before, "not patched in place");
    no_reserved_left(&dst);
    // Pull: the local side receives, patched in place.
    let before = ino(&back.join("f"));
    assert_patched(
        &summary(pull(&[small_min()]).ok()),
        new.len(),
        literal + 77_777,
    );
    assert_same(&dst.join("f"), &back.join("f"));
    assert_eq!(ino(&back.join("f")), before, "not patched in place");
    // A pull killed half way: the next listing rolls it back, the next
    // pull completes.
    let old_mtime = get_mtime(&back.join("f"));
    let (newer, literal) = scattered(&new, 11, 5000);
    write(&src, "f", &newer);
    push().ok();
    let die = ("FERRY_TEST_APPEND_DIE", (literal / 2).to_string());
    assert!(pull(&[small_min(), die]).code.is_none());
    assert_eq!(find_prefixed(&back, b".ferry-undo-").len(), 1);
    // `ls` only reads: the record stays; a copy reading it rolls back.
    ferry(["ls".as_ref(), back.as_os_str()]).ok();
    assert_eq!(find_prefixed(&back, b".ferry-undo-").len(), 1);
    let look = d.path().join("look");
    ferry(["copy".as_ref(), back.as_os_str(), look.as_os_str()]).ok();
    assert!(
        std::fs::read(back.join("f")).unwrap() == new,
        "not rolled back"
    );
    assert_eq!(get_mtime(&back.join("f")), old_mtime);
    no_reserved_left(&back);
    assert_patched(&summary(pull(&[small_min()]).ok()), newer.len(), literal);
    assert_same(&dst.join("f"), &back.join("f"));
    no_reserved_left(&back);
}

/// A push patching scattered blocks in place whose remote end dies half
/// way: the file there is half patched, beside its rollback record; the
/// next listing of that directory (a pull) puts the old bytes, mtime and
/// mode back; the next push patches it in place again and completes.
#[test]
fn remote_end_killed_mid_patch_is_rolled_back_there() {
    let Some((rsh, host)) = server() else { return };
    let d = tmpdir();
    let (src, dst, look) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("look"),
    );
    let data = gen_bytes(4 << 20, 91);
    write(&src, "f", &data);
    set_mode(&src.join("f"), 0o644);
    let to = at(&host, &dst);
    let (new, literal) = scattered(&data, 13, 6000);
    let dying = dying_ferry(d.path(), literal / 2);
    let push = |remote: &OsStr| push_with(&rsh, remote, &src, &to);
    push(&bin()).ok();
    let old_mtime = get_mtime(&dst.join("f"));
    let before = ino(&dst.join("f"));
    write(&src, "f", &new);
    set_mode(&src.join("f"), 0o600);
    let r = push(dying.as_os_str());
    assert!(
        r.code.is_some_and(|c| c != 0),
        "the remote died: not a success\n{r}"
    );
    let half = std::fs::read(dst.join("f")).unwrap();
    assert_eq!(half.len(), data.len());
    assert!(half != data && half != new, "not half patched\n{r}");
    assert_eq!(find_prefixed(&dst, b".ferry-undo-").len(), 1);
    // A pull of the remote directory lists it there: the old file back.
    list_there(&rsh, &host, &dst, &look);
    assert!(std::fs::read(look.join("f")).unwrap() == data);
    assert!(
        std::fs::read(dst.join("f")).unwrap() == data,
        "not rolled back"
    );
    assert_eq!(get_mtime(&dst.join("f")), old_mtime);
    assert_eq!(mode(&dst.join("f")), 0o644);
    assert_eq!(ino(&dst.join("f")), before);
    no_reserved_left(&dst);
    // The next push patches it in place and completes.
    assert_patched(&summary(push(&bin()).ok()), new.len(), literal);
    assert_same(&src.join("f"), &dst.join("f"));
    assert_eq!(ino(&dst.join("f")), before, "not patched in place");
    no_reserved_left(&dst);
}

/// The remote end dies in the middle of patching one of several files
/// going by delta: the run names the lost connection (exit 1, one line),
/// and no file is counted "sent whole after a failed delta": a lost
/// connection is not a failed delta, nothing was sent whole.
#[test]
fn a_lost_connection_is_not_a_failed_delta() {
    let Some((rsh, host)) = server() else { return };
    let d = tmpdir();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let mut news = Vec::new();
    let mut lit = 0;
    for i in 0..4u64 {
        let data = gen_bytes(4 << 20, 200 + i);
        write(&src, format!("f{i}"), &data);
        let (new, literal) = scattered(&data, 13, 6000);
        lit = literal;
        news.push(new);
    }
    let to = at(&host, &dst);
    push_with(&rsh, &bin(), &src, &to).ok();
    for (i, new) in news.iter().enumerate() {
        write(&src, format!("f{i}"), new);
    }
    let dying = dying_ferry(d.path(), lit / 2);
    let r = push_with(&rsh, dying.as_os_str(), &src, &to);
    r.code_is(1);
    assert!(r.err().contains("connection lost"), "{r}");
    let s = summary(&r);
    assert_eq!(s["delta_fallbacks"].as_u64().unwrap_or(0), 0, "{r}");
    // The text summary says nothing of the kind either.
    write(&src, "f0", &gen_bytes(4 << 20, 300));
    let a = remote_args(&rsh, &["copy".as_ref(), src.as_os_str(), &to]);
    let mut a: Vec<&OsStr> = a.iter().map(|s| s.as_os_str()).collect();
    a[4] = dying.as_os_str();
    let r = ferry_env(&a, &[small_min()]);
    assert!(r.code.is_some_and(|c| c != 0), "{r}");
    assert!(!r.err().contains("failed delta"), "{r}");
}
