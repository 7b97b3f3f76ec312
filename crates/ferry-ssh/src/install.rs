//! Self-install: a remote with no ferry of this protocol, of the same OS
//! and architecture as this machine (`uname -sm` there and here), gets this
//! very binary in a per-user cache, `${XDG_CACHE_HOME:-$HOME/.cache}/ferry/
//! ferry-<version>-<first 16 hex of its SHA-256>`, which later runs reuse.
//!
//! A cached file is run only when its SHA-256 there is this binary's. The
//! upload goes to a temporary name in the cache directory, is checked
//! there, made executable and then linked to its final name, which never
//! replaces a file: a file of that name with other content is not ferry's,
//! and the run stops with one line saying to remove it ([`NOT_THIS`]: no
//! SFTP in its place either). Both steps run through the same ssh command
//! as the session (`-e`, `--port`), each one POSIX shell command line.
//!
//! Runs that start at once on a host without ferry race to install it:
//! each uploads to a temporary name of its own, and the link that makes
//! the final name is atomic, so a final name, once there, is whole. A run
//! whose link finds the name taken (another run won) checks that file's
//! SHA-256 as the probe does and runs it when it is this binary: the
//! race costs an upload, never the run.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::conn::Target;
use crate::proto;

/// The SHA-256 of a file on the remote, printed as 64 hex digits (GNU
/// coreutils, or the BSDs' and macOS's shasum); nothing when neither runs.
const SUM: &str = "{ sha256sum \"$1\" || shasum -a 256 \"$1\"; } 2>/dev/null | cut -c1-64";

/// This binary as installed on `t`'s host, when it has no ferry of this
/// protocol (`why` says so): the target that runs it. `Err` is the one
/// line saying why it cannot be, and what to do.
pub fn install(t: &Target, why: &str) -> Result<Target, String> {
    let fail = |what: String| {
        format!("{what}; {why} (ferry installs itself only on the same OS and architecture; --no-remote-install turns that off)")
    };
    let exe = std::env::current_exe().map_err(|e| fail(format!("this ferry's binary: {e}")))?;
    let bin = std::fs::read(&exe).map_err(|e| fail(format!("{}: {e}", exe.display())))?;
    let sum = hex(&Sha256::digest(&bin));
    let name = format!("ferry-{}-{}", proto::version(), &sum[..16]);
    let here = local_uname().map_err(|e| fail(format!("uname here: {e}")))?;
    // One round trip: the remote's OS and architecture, its cache
    // directory, and the hash of a cached file of that name.
    let probe = format!(
        "sum() {{ {SUM}; }}; uname -sm; d=\"${{XDG_CACHE_HOME:-$HOME/.cache}}/ferry\"; echo \"$d\"; if [ -f \"$d/{name}\" ]; then sum \"$d/{name}\"; echo; fi"
    );
    let out = run(t, &probe, None).map_err(|e| match crate::conn::is_ssh_failure(&e) {
        true => format!("{e} (looking for ferry's cache there)"),
        false => fail(format!("{}: {e}", t.host)),
    })?;
    let mut lines = out.lines();
    let (there, dir) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    if there.trim() != here.trim() {
        return Err(fail(format!(
            "{}: the remote is {:?}, this machine {:?}",
            t.host,
            there.trim(),
            here.trim()
        )));
    }
    if !dir.starts_with('/') {
        return Err(fail(format!(
            "{}: no cache directory (is $HOME set?)",
            t.host
        )));
    }
    let path = format!("{dir}/{name}");
    let mut found = Target {
        remote_ferry: quote(&path),
        install: false,
        ..t.clone()
    };
    match lines.next().map(str::trim) {
        Some(s) if s == sum => return Ok(found),
        Some(s) => return Err(not_this(t, &path, s)),
        None => {}
    }
    // The upload: to a temporary name, checked, then linked to the final
    // name (`ln` fails rather than replace a file that appeared since).
    // When the link finds the name taken, by a run that installed at the
    // same time (or by anyone), that file's hash is the answer: `there
    // HASH`. A link that fails with no file there is tried again for its
    // error.
    let out = match run(t, &put_script(dir, &name, &sum), Some(&bin)) {
        Ok(o) => o,
        // ssh failed or was killed: the one line says so (the run stops).
        Err(e) if crate::conn::is_ssh_failure(&e) => {
            return Err(format!("{e} (installing ferry in {path})"))
        }
        Err(e) => return Err(fail(format!("{}: installing ferry in {path}: {e}", t.host))),
    };
    match out.trim().strip_prefix("there") {
        // Installed by another run meanwhile: run it when it is this ferry.
        Some(s) if s.trim() == sum => {}
        Some(s) => return Err(not_this(t, &path, s.trim())),
        None if out.trim() == "installed" => {
            eprintln!("ferry: note: installed this ferry on {} as {path}", t.host);
        }
        None => {
            return Err(fail(format!(
                "{}: installing ferry: {}",
                t.host,
                out.trim()
            )))
        }
    }
    found.install = false;
    Ok(found)
}

/// The shell command that installs the bytes on its stdin as `dir/name`
/// when their SHA-256 is `sum`. It prints `installed`, or `there HASH`
/// when the name was taken before its link (HASH: that file's). Its
/// temporary goes however it ends: an upload cut short (this ferry or
/// its ssh killed) ends its input or hangs it up.
fn put_script(dir: &str, name: &str, sum: &str) -> String {
    format!(
        "sum() {{ {SUM}; }}; set -e; umask 022; d={d}; mkdir -p \"$d\"; t=\"$d/.{name}.$$.tmp\"; trap 'rm -f \"$t\"' EXIT; trap 'exit 4' HUP INT TERM PIPE; cat > \"$t\"; [ \"$(sum \"$t\")\" = {sum} ] || {{ echo 'the upload arrived changed' >&2; exit 3; }}; chmod 755 \"$t\"; if ln \"$t\" \"$d/{name}\" 2>/dev/null; then echo installed; elif [ -e \"$d/{name}\" ]; then echo \"there $(sum \"$d/{name}\")\"; else ln \"$t\" \"$d/{name}\"; fi",
        d = quote(dir)
    )
}

/// Part of the one line for a cached file that is not this binary: the
/// run stops there (exit 2), served neither by it nor over SFTP.
pub const NOT_THIS: &str = "is not this ferry";

/// The one line for `path` on `t`'s host, whose SHA-256 there is `sum`
/// (empty: unknown), not this binary's.
fn not_this(t: &Target, path: &str, sum: &str) -> String {
    format!(
        "{}: {path} {NOT_THIS} (its SHA-256 is {:?}): ferry does not replace a file it did not write; remove it, or name a ferry with --remote-ferry PATH",
        t.host,
        if sum.is_empty() { "unknown" } else { sum }
    )
}

/// `uname -sm` of this machine.
fn local_uname() -> std::io::Result<String> {
    let o = Command::new("uname").arg("-sm").output()?;
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Run `cmd` on `t`'s host with `input` on its stdin: its stdout, or what
/// it said on stderr when it failed.
fn run(t: &Target, cmd: &str, input: Option<&[u8]>) -> Result<String, String> {
    let argv = t.command(&format!("sh -c {} sh", quote(cmd)));
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", argv[0]))?;
    let feed = input.map(|b| {
        let mut stdin = child.stdin.take().expect("piped");
        let b = b.to_vec();
        std::thread::spawn(move || stdin.write_all(&b))
    });
    let mut err = String::new();
    let mut errp = child.stderr.take().expect("piped");
    let errt = std::thread::spawn(move || {
        let _ = errp.read_to_string(&mut err);
        err
    });
    let mut out = String::new();
    let _ = child.stdout.take().expect("piped").read_to_string(&mut out);
    let status = child.wait().map_err(|e| e.to_string())?;
    let err = errt.join().unwrap_or_default();
    let fed = feed.map(|f| f.join());
    // ssh itself failed (exit 255: unreachable, authentication, ...) or
    // was killed: said as for a session, so that the run stops (exit 2)
    // rather than take the host for one where ferry cannot run.
    if status.code() == Some(255) {
        let tail: Vec<String> = err.lines().map(str::to_string).collect();
        return Err(crate::conn::classify(t, Some(255), &tail));
    }
    if status.code().is_none() {
        return Err(format!("{}: ssh failed: {status}", t.host));
    }
    if !status.success() {
        // The last words on stderr, else on stdout (an SFTP-only server
        // answers a command with a line there).
        let last = |s: &str| {
            s.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_string())
        };
        let why = last(&err).or_else(|| last(&out));
        return Err(match why {
            Some(w) => format!("{status}: {w}"),
            None => status.to_string(),
        });
    }
    if let Some(Ok(Err(e))) = fed {
        return Err(e.to_string());
    }
    Ok(out)
}

/// `s` in single quotes for a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_a_shell() {
        let s = "a'b \"c\" $d";
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", quote(s)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), s);
        assert_eq!(hex(&[0, 0xab]), "00ab");
    }

    /// The install step, run here by `sh`: the first install links the
    /// file; one that finds the name taken (a run that installed at the
    /// same time, or a planted file) answers with that file's hash and
    /// leaves it alone; no temporary stays behind either way.
    #[test]
    fn the_install_step_answers_for_a_name_taken_meanwhile() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cache dir's");
        let dir_s = dir.to_str().unwrap();
        let put = |bytes: &[u8]| {
            let sum = hex(&Sha256::digest(bytes));
            let mut c = Command::new("sh")
                .arg("-c")
                .arg(put_script(dir_s, "ferry-x", &sum))
                .arg("sh")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            c.stdin.take().unwrap().write_all(bytes).unwrap();
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "{o:?}");
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        let names = || {
            let mut v: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        assert_eq!(put(b"ferry"), "installed");
        // Another run's upload of the same binary finds it there.
        let same = hex(&Sha256::digest(b"ferry"));
        assert_eq!(put(b"ferry"), format!("there {same}"));
        // A file of other content planted under the name: its hash, not replaced.
        std::fs::remove_file(dir.join("ferry-x")).unwrap();
        std::fs::write(dir.join("ferry-x"), b"planted").unwrap();
        let planted = hex(&Sha256::digest(b"planted"));
        assert_eq!(put(b"ferry"), format!("there {planted}"));
        assert_eq!(std::fs::read(dir.join("ferry-x")).unwrap(), b"planted");
        assert_eq!(names(), vec![std::ffi::OsString::from("ferry-x")]);
    }
}
