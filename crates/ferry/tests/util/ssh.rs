//! Shared helpers of the tests against the real OpenSSH server `scripts/sshd` starts
//! (`FERRY_TEST_SSH_*`, set by `scripts/test`). The server is this machine, so a remote
//! tree is checked on disk.

use std::ffi::OsString;
use std::path::Path;

use super::*;

/// (the -e command, the host alias), or why the test skips.
pub fn ssh_server() -> Result<(String, String), String> {
    let v = |k: &str| {
        std::env::var(format!("FERRY_TEST_SSH_{k}"))
            .map_err(|_| format!("FERRY_TEST_SSH_{k} is not set (scripts/test starts sshd)"))
    };
    Ok((v("RSH")?, v("HOST")?))
}

/// `host:path` of a local path.
pub fn ssh_at(host: &str, p: &Path) -> OsString {
    let mut s = OsString::from(format!("{host}:"));
    s.push(p.as_os_str());
    s
}

/// `ferry CMD` with the server's `-e`, this build as the remote ferry, then `args`.
pub fn ferry_ssh<S: AsRef<OsStr>>(rsh: &str, cmd: &str, args: &[S]) -> Run {
    let mut a: Vec<OsString> = vec![cmd.into(), "-e".into(), rsh.into()];
    a.push("--remote-ferry".into());
    a.push(bin());
    a.extend(args.iter().map(|s| s.as_ref().to_os_string()));
    ferry(&a)
}
