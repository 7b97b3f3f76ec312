//! Self-install: a remote with no ferry of this protocol, of the same OS
//! and architecture as this machine (`uname -sm` there and here), gets this
//! very binary in a per-user cache, `${XDG_CACHE_HOME:-$HOME/.cache}/ferry/
//! ferry-<version>-<first 16 hex of its SHA-256>`, which later runs reuse.
//!
//! A cached file is run only when its SHA-256 there is this binary's. The
//! upload goes to a temporary name in the cache directory, is checked
//! there, made executable and then linked to its final name, which never
//! replaces a file: a file of that name with other content is not ferry's,
//! and the run stops with one line saying to remove it. Both steps run
//! through the same ssh command as the session (`-e`, `--port`), each one
//! POSIX shell command line.

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
    let out = run(t, &probe, None).map_err(|e| fail(format!("{}: {e}", t.host)))?;
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
        Some(s) => {
            return Err(format!(
                "{}: {path} is not this ferry (its SHA-256 is {:?}): ferry does not replace a file it did not write; remove it, or name a ferry with --remote-ferry PATH",
                t.host,
                if s.is_empty() { "unknown" } else { s }
            ))
        }
        None => {}
    }
    // The upload: to a temporary name, checked, then linked to the final
    // name (`ln` fails rather than replace a file that appeared since).
    let put = format!(
        "sum() {{ {SUM}; }}; set -e; umask 022; d={d}; mkdir -p \"$d\"; t=\"$d/.{name}.$$.tmp\"; trap 'rm -f \"$t\"' EXIT; cat > \"$t\"; [ \"$(sum \"$t\")\" = {sum} ] || {{ echo 'the upload arrived changed' >&2; exit 3; }}; chmod 755 \"$t\"; ln \"$t\" \"$d/{name}\"; echo installed",
        d = quote(dir)
    );
    match run(t, &put, Some(&bin)) {
        Ok(o) if o.trim() == "installed" => {}
        Ok(o) => return Err(fail(format!("{}: installing ferry: {}", t.host, o.trim()))),
        Err(e) => return Err(fail(format!("{}: installing ferry in {path}: {e}", t.host))),
    }
    eprintln!("ferry: note: installed this ferry on {} as {path}", t.host);
    found.install = false;
    Ok(found)
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
}
