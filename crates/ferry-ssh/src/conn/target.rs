//! How a host is reached: the ssh command line of a connection (the
//! start command, a subsystem), AES-GCM first where ssh is left to its
//! defaults, and the words of a `-e` command.

use parking_lot::Mutex;
use std::process::{Command, Stdio};

use super::{Settings, Target};
use crate::install::Look;
use crate::quiet;
use crate::SessionError;

impl Target {
    /// The target for `host` (`[user@]host`, brackets around an IPv6
    /// address allowed) and `port`, with the default settings.
    pub fn new(host: &str, port: Option<u16>) -> Result<Target, crate::SessionError> {
        Target::with(host, port, &Settings::default())
    }

    /// The target for `host` and `port` with the settings `set` (this
    /// run's: the command line's).
    pub fn with(
        host: &str,
        port: Option<u16>,
        set: &Settings,
    ) -> Result<Target, crate::SessionError> {
        let set = set.clone();
        let install = set.remote_ferry.is_none() && !set.no_remote_install;
        let (rsh, rf) = (set.rsh, set.remote_ferry);
        let rsh = rsh
            .or_else(|| {
                std::env::var("FERRY_RSH")
                    .ok()
                    .filter(|s| !s.trim().is_empty())
            })
            .unwrap_or_else(|| "ssh".into());
        let rsh = split_words(&rsh).map_err(|e| format!("-e/FERRY_RSH {rsh:?}: {e}"))?;
        if rsh.is_empty() {
            return Err("-e/FERRY_RSH: empty command".into());
        }
        let host = match host.split_once('@') {
            Some((u, h)) => format!("{u}@{}", h.trim_start_matches('[').trim_end_matches(']')),
            None => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        };
        if host.starts_with('-') || host.is_empty() {
            return Err(format!("{host:?}: not a host name").into());
        }
        let options = fast_cipher(&rsh, &host, port)
            .map(|c| vec!["-o".into(), c])
            .unwrap_or_default();
        Ok(Target {
            rsh,
            host,
            port,
            remote_ferry: rf.unwrap_or_else(|| "ferry".into()),
            install,
            options,
            connections: set.connections,
            timeout: set.timeout.unwrap_or(quiet::DEFAULT_TIMEOUT),
            read_only: set.read_only,
        })
    }

    pub(super) fn argv(&self) -> Vec<String> {
        self.command(&format!("{} serve", self.remote_ferry))
    }

    /// The command line of a connection: `--remote-ferry`'s, or with
    /// self-install, the start command that looks for ferry as `look`
    /// says ([`crate::install::start_script`]; `sum`: the shipped binary's
    /// SHA-256, for [`Look::Verify`]).
    pub(super) fn argv_look(&self, look: Look, sum: &str) -> Result<Vec<String>, SessionError> {
        if !self.install {
            return Ok(self.argv());
        }
        let name = crate::install::cache_name()?;
        Ok(self.command(&format!(
            "sh -c {} sh {}",
            crate::install::quote(&crate::install::start_script(look, sum)),
            crate::install::quote(name)
        )))
    }

    /// The ssh command line that starts subsystem `name` (`sftp`) there
    /// (`ssh -s host name`): no remote shell involved.
    pub fn subsystem(&self, name: &str) -> Vec<String> {
        let mut a = self.rsh.clone();
        a.push("-s".into());
        a.extend(self.command(name).drain(self.rsh.len()..));
        a
    }

    /// The ssh command line that runs `remote` (a shell command) there.
    pub(crate) fn command(&self, remote: &str) -> Vec<String> {
        let mut a = self.rsh.clone();
        if let Some(p) = self.port {
            a.extend(["-p".into(), p.to_string()]);
        }
        a.extend(self.options.iter().cloned());
        a.push(self.host.clone());
        a.push(remote.into());
        a
    }
}

/// OpenSSH's built-in cipher order (unchanged since 6.9).
const SSH_DEFAULT_CIPHERS: &str = "chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr,aes128-gcm@openssh.com,aes256-gcm@openssh.com";

/// `Ciphers=...` with AES-GCM first, when `rsh` is OpenSSH's `ssh` left to
/// its built-in cipher order (no `-c`, no `Ciphers` on its command line or
/// in its configuration for `host`, as `ssh -G` prints it) and this CPU
/// has AES instructions: one stream's throughput is bound by its cipher,
/// and AES-GCM with those instructions is the fastest ssh has. The
/// server's own list still decides what it accepts; a user's choice is
/// never changed.
pub(super) fn fast_cipher(rsh: &[String], host: &str, port: Option<u16>) -> Option<String> {
    // Asked once per command, host and port in a run: every location and
    // every session to a host makes its `Target` (a second `ssh -G`, the
    // connection's set-up waiting on it, was 20-30 ms of each run).
    type Asked = (Vec<String>, String, Option<u16>);
    static ASKED: Mutex<Vec<(Asked, Option<String>)>> = Mutex::new(Vec::new());
    let key = (rsh.to_vec(), host.to_string(), port);
    let mut asked = ASKED.lock();
    if let Some((_, c)) = asked.iter().find(|(k, _)| *k == key) {
        return c.clone();
    }
    let c = ask_ssh_ciphers(rsh, host, port);
    asked.push((key, c.clone()));
    c
}

/// [`fast_cipher`], asked of ssh (`ssh -G`).
fn ask_ssh_ciphers(rsh: &[String], host: &str, port: Option<u16>) -> Option<String> {
    let prog = std::path::Path::new(rsh.first()?).file_name()?;
    if prog != "ssh"
        || rsh[1..].iter().any(|w| {
            (w.starts_with("-c") && !w.starts_with("--"))
                || w.to_ascii_lowercase().contains("ciphers")
        })
        || !cpu_has_aes()
    {
        return None;
    }
    let mut cmd = Command::new(&rsh[0]);
    cmd.args(&rsh[1..]).arg("-G");
    if let Some(p) = port {
        cmd.args(["-p", &p.to_string()]);
    }
    let out = cmd
        .arg(host)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let list = text.lines().find_map(|l| l.strip_prefix("ciphers "))?;
    if !out.status.success() || list.trim() != SSH_DEFAULT_CIPHERS {
        return None;
    }
    let (gcm, rest): (Vec<&str>, Vec<&str>) = SSH_DEFAULT_CIPHERS
        .split(',')
        .partition(|c| c.contains("-gcm@"));
    Some(format!("Ciphers={}", [gcm, rest].concat().join(",")))
}

/// Whether this CPU has AES instructions (`aes` among its flags).
pub(super) fn cpu_has_aes() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
        s.lines()
            .filter(|l| l.starts_with("flags") || l.starts_with("Features"))
            .any(|l| l.split_whitespace().any(|w| w == "aes"))
    })
}

/// Words of a command line, as a shell splits them: blanks separate,
/// single and double quotes group, a backslash escapes the next character.
/// Returns `String`, as a clap value parser does: a usage message the caller
/// folds into its own (`-e/FERRY_RSH ...: ...`).
pub fn split_words(s: &str) -> Result<Vec<String>, SessionError> {
    let (mut words, mut cur, mut has) = (Vec::new(), String::new(), false);
    let mut it = s.chars();
    while let Some(c) = it.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if has {
                    words.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            '\'' => {
                has = true;
                loop {
                    match it.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err("unterminated '".into()),
                    }
                }
            }
            '"' => {
                has = true;
                loop {
                    match it.next() {
                        Some('"') => break,
                        Some('\\') => cur.push(it.next().ok_or("trailing \\")?),
                        Some(c) => cur.push(c),
                        None => return Err("unterminated \"".into()),
                    }
                }
            }
            '\\' => {
                has = true;
                cur.push(it.next().ok_or("trailing \\")?);
            }
            c => {
                has = true;
                cur.push(c);
            }
        }
    }
    if has {
        words.push(cur);
    }
    Ok(words)
}
