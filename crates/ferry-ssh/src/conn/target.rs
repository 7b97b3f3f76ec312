//! How a host is reached: the ssh command line of a connection (the
//! start command, a subsystem), AES-GCM first where ssh is left to its
//! defaults, and the words of a `-e` command.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};

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
        let options = cipher_options(&rsh, &host, port);
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

    #[cfg(test)]
    pub(super) fn argv(&self) -> Vec<String> {
        self.command(&format!("{} serve", self.remote_ferry))
    }

    /// The command line of a connection: `--remote-ferry`'s, or with
    /// self-install, the start command that looks for ferry as `look`
    /// says ([`crate::install::start_script`]; `sum`: the shipped binary's
    /// SHA-256, for [`Look::Verify`]). Its cipher options are the ones to
    /// start with now ([`Options::now`]): when they are a guess, they are
    /// returned too, to be checked against `ssh -G`'s answer before the
    /// connection is used. `walk`: the tree the run walks there, named to
    /// the cached ferry that the start command runs, which answers its
    /// first levels unasked ([`crate::install::walk_word`]).
    pub(super) fn argv_look(
        &self,
        look: Look,
        sum: &str,
        walk: Option<&[u8]>,
    ) -> Result<(Vec<String>, Option<Vec<String>>), SessionError> {
        let (options, guessed) = self.options.now();
        let remote = if self.install {
            let name = crate::install::cache_name()?;
            let mut c = format!(
                "sh -c {} sh {}",
                crate::install::quote(&crate::install::start_script(look, sum)),
                crate::install::quote(name)
            );
            if let Some(w) = self.walk_word(walk) {
                c.push(' ');
                c.push_str(&w);
            }
            c
        } else {
            format!("{} serve", self.remote_ferry)
        };
        let argv = self.command_with(&remote, &options);
        Ok((argv, guessed.then_some(options)))
    }

    /// The walked tree as the start command passes it to the cached ferry
    /// ([`crate::install::walk_word`]): with self-install only. With it,
    /// that ferry answers the first flight unasked.
    pub(super) fn walk_word(&self, walk: Option<&[u8]>) -> Option<String> {
        walk.filter(|_| self.install)
            .and_then(crate::install::walk_word)
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
        self.command_with(remote, &self.options.known())
    }

    fn command_with(&self, remote: &str, options: &[String]) -> Vec<String> {
        let mut a = self.rsh.clone();
        if let Some(p) = self.port {
            a.extend(["-p".into(), p.to_string()]);
        }
        a.extend(options.iter().cloned());
        a.push(self.host.clone());
        a.push(remote.into());
        a
    }
}

/// OpenSSH's built-in cipher order (unchanged since 6.9).
const SSH_DEFAULT_CIPHERS: &str = "chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr,aes128-gcm@openssh.com,aes256-gcm@openssh.com";

/// The options a connection's ssh is given before the host: fixed, or
/// AES-GCM first as `ssh -G` answers (`cipher_options`).
#[derive(Clone, Debug)]
pub enum Options {
    /// These (none where ferry does not choose a cipher order).
    Fixed(Vec<String>),
    /// Asked of `ssh -G` for this command, host and port: one question per
    /// run, shared by every `Target` of the three.
    Asked(Arc<Ask>),
}

impl PartialEq for Options {
    fn eq(&self, other: &Options) -> bool {
        match (self, other) {
            (Options::Fixed(a), Options::Fixed(b)) => a == b,
            (Options::Asked(a), Options::Asked(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Options {}

impl std::hash::Hash for Options {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        match self {
            Options::Fixed(v) => v.hash(h),
            Options::Asked(a) => Arc::as_ptr(a).hash(h),
        }
    }
}

impl Options {
    /// Start `ssh -G` now if it was left for after the first
    /// connection's ssh ([`Options::now`] gave that one the guess).
    pub(super) fn ask(&self) {
        if let Options::Asked(a) = self {
            a.ask();
        }
    }

    /// The options, as `ssh -G` answers (waited for when still asked).
    pub fn known(&self) -> Vec<String> {
        match self {
            Options::Fixed(v) => v.clone(),
            Options::Asked(a) => words(a.truth()),
        }
    }

    /// The options to start a connection with now, and whether they are a
    /// guess: `ssh -G`'s answer when it is in, else the answer of the last
    /// run that asked for this command, host and port (the file
    /// [`cache_file`]); without one, the answer waited for.
    pub(super) fn now(&self) -> (Vec<String>, bool) {
        match self {
            Options::Fixed(v) => (v.clone(), false),
            Options::Asked(a) => match (a.truth.get(), &a.guess) {
                (Some(t), _) => (words(t.clone()), false),
                // `ssh -G` still running: the last run's answer.
                (None, Some(g)) if !a.answered() => (words(g.clone()), true),
                _ => (words(a.truth()), false),
            },
        }
    }
}

fn words(c: Option<String>) -> Vec<String> {
    c.map(|c| vec!["-o".into(), c]).unwrap_or_default()
}

/// One `ssh -G` question: running while the first connection starts with
/// the last run's answer, which is checked against it before anything is
/// sent over that connection ([`Options::now`]).
#[derive(Debug)]
pub struct Ask {
    /// The last run's answer (`Some(None)`: no cipher order given).
    pub(super) guess: Option<Option<String>>,
    /// This run's answer.
    truth: OnceLock<Option<String>>,
    /// `ssh -G`, until its answer is read.
    asking: Mutex<Asking>,
    /// Where the answer is kept for the next run, and under which key.
    keep: Option<(PathBuf, String)>,
}

/// Where `ssh -G` is.
#[derive(Debug)]
enum Asking {
    /// Not started yet: with a guess, it is started once the first
    /// connection's ssh is ([`Ask::ask`]), which then starts at once.
    Later(Command),
    /// Running (`None`: it could not be started).
    Running(Option<Child>),
    /// Its answer taken.
    Done,
}

impl Ask {
    /// Start `ssh -G` for `rsh`, `host`, `port`; the last answer read from
    /// `file` (and this one kept there).
    pub(super) fn start(
        rsh: &[String],
        host: &str,
        port: Option<u16>,
        file: Option<PathBuf>,
    ) -> Ask {
        let key = {
            use sha2::Digest;
            let mut h = sha2::Sha256::new();
            for w in rsh {
                h.update(w.as_bytes());
                h.update([0]);
            }
            h.update(host.as_bytes());
            h.update(format!("\0{port:?}").as_bytes());
            crate::install::hex(&h.finalize()[..12])
        };
        let guess = file.as_deref().and_then(|f| {
            let text = std::fs::read_to_string(f).ok()?;
            let prefix = format!("{key} ");
            let line = text.lines().find_map(|l| l.strip_prefix(&prefix))?;
            match line.trim() {
                "gcm" => Some(Some(gcm_first())),
                "-" => Some(None),
                _ => None,
            }
        });
        let mut cmd = Command::new(&rsh[0]);
        cmd.args(&rsh[1..]).arg("-G");
        if let Some(p) = port {
            cmd.args(["-p", &p.to_string()]);
        }
        cmd.arg(host)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // (Starting a process holds this thread a millisecond or more: with
        // a guess, the connection's ssh goes first.)
        let asking = match guess {
            Some(_) => Asking::Later(cmd),
            None => Asking::Running(cmd.spawn().ok()),
        };
        Ask {
            guess,
            truth: OnceLock::new(),
            asking: Mutex::new(asking),
            keep: file.map(|f| (f, key)),
        }
    }

    /// Start `ssh -G` if it was left for after the first connection's ssh.
    pub(super) fn ask(&self) {
        let mut a = self.asking.lock();
        if let Asking::Later(cmd) = &mut *a {
            let child = cmd.spawn().ok();
            // Its answer is waited for only once the connection's ssh is
            // up: till then it takes only the time the key exchange, the
            // listing here and the walk leave (5-7 ms of CPU, most of it
            // loading ssh's libraries, on the cores they share).
            if let Some(pid) = child
                .as_ref()
                .and_then(|c| rustix::process::Pid::from_raw(c.id() as i32))
            {
                let _ = rustix::process::setpriority_process(Some(pid), 19);
            }
            *a = Asking::Running(child);
        }
    }

    /// `ssh -G` has exited (its answer can be read without waiting), or
    /// its answer was taken.
    fn answered(&self) -> bool {
        match &mut *self.asking.lock() {
            Asking::Later(_) => false,
            Asking::Running(c) => c
                .as_mut()
                .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_)))),
            Asking::Done => true,
        }
    }

    /// `ssh -G`'s answer: `Ciphers=...` with AES-GCM first when ssh is left
    /// to its built-in order, else none. Kept for the next run when it is
    /// not what the last one found.
    pub(super) fn truth(&self) -> Option<String> {
        self.truth
            .get_or_init(|| {
                self.ask();
                let child = match std::mem::replace(&mut *self.asking.lock(), Asking::Done) {
                    Asking::Running(c) => c,
                    _ => None,
                };
                let answer = child
                    .and_then(|c| c.wait_with_output().ok())
                    .and_then(|out| {
                        let text = String::from_utf8_lossy(&out.stdout);
                        let list = text.lines().find_map(|l| l.strip_prefix("ciphers "))?;
                        (out.status.success() && list.trim() == SSH_DEFAULT_CIPHERS).then(gcm_first)
                    });
                if self.guess.as_ref() != Some(&answer) {
                    if let Some((file, key)) = &self.keep {
                        keep_answer(file, key, answer.is_some());
                    }
                }
                answer
            })
            .clone()
    }
}

/// `Ciphers=` with OpenSSH's built-in ciphers, AES-GCM first.
pub(super) fn gcm_first() -> String {
    let (gcm, rest): (Vec<&str>, Vec<&str>) = SSH_DEFAULT_CIPHERS
        .split(',')
        .partition(|c| c.contains("-gcm@"));
    format!("Ciphers={}", [gcm, rest].concat().join(","))
}

/// Where the last answers of `ssh -G` are kept:
/// `${XDG_CACHE_HOME:-$HOME/.cache}/ferry/ssh-ciphers`.
pub(super) fn cache_file() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("ferry").join("ssh-ciphers"))
}

/// Keep `key`'s answer in `file` (the newest 64 keys), written whole
/// under a temporary name and renamed: a reader sees the old file or the
/// new one. A failure is no error: the next run asks before it connects.
fn keep_answer(file: &Path, key: &str, gcm: bool) {
    let old = std::fs::read_to_string(file).unwrap_or_default();
    let prefix = format!("{key} ");
    let mut lines: Vec<&str> = old.lines().filter(|l| !l.starts_with(&prefix)).collect();
    let line = format!("{key} {}", if gcm { "gcm" } else { "-" });
    lines.push(&line);
    let from = lines.len().saturating_sub(64);
    let text = lines[from..].join("\n") + "\n";
    let Some(dir) = file.parent() else { return };
    let _ = std::fs::create_dir_all(dir);
    let tmp = dir.join(format!(".ssh-ciphers.{}", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The cipher options of a connection through `rsh` to `host` and `port`:
/// `Ciphers=...` with AES-GCM first when `rsh` is OpenSSH's `ssh` left to
/// its built-in cipher order (no `-c`, no `Ciphers` on its command line or
/// in its configuration for `host`, as `ssh -G` prints it) and this CPU
/// has AES instructions: one stream's throughput is bound by its cipher,
/// and AES-GCM with those instructions is the fastest ssh has. The
/// server's own list still decides what it accepts; a user's choice is
/// never changed.
///
/// `ssh -G` runs beside the first connection's start, not before it (it
/// was 5-15 ms of every run's start): that connection is started with the
/// last run's answer and, when `ssh -G` answers otherwise (the
/// configuration changed since), given up before anything is sent over it
/// and started again ([`Options::now`]). Asked once per command, host and
/// port in a run.
pub(super) fn cipher_options(rsh: &[String], host: &str, port: Option<u16>) -> Options {
    type Key = (Vec<String>, String, Option<u16>);
    static ASKED: Mutex<Vec<(Key, Arc<Ask>)>> = Mutex::new(Vec::new());
    if !asks(rsh) {
        return Options::Fixed(Vec::new());
    }
    let key = (rsh.to_vec(), host.to_string(), port);
    let mut asked = ASKED.lock();
    if let Some((_, a)) = asked.iter().find(|(k, _)| *k == key) {
        return Options::Asked(a.clone());
    }
    let a = Arc::new(Ask::start(rsh, host, port, cache_file()));
    asked.push((key, a.clone()));
    Options::Asked(a)
}

/// [`cipher_options`]' answer, waited for.
#[cfg(test)]
pub(super) fn fast_cipher(rsh: &[String], host: &str, port: Option<u16>) -> Option<String> {
    cipher_options(rsh, host, port).known().get(1).cloned()
}

/// Whether `ssh -G` is asked at all: `rsh` is OpenSSH's `ssh` with no
/// cipher on its command line, and this CPU has AES instructions.
fn asks(rsh: &[String]) -> bool {
    let Some(prog) = rsh
        .first()
        .and_then(|p| std::path::Path::new(p).file_name())
    else {
        return false;
    };
    prog == "ssh"
        && !rsh[1..].iter().any(|w| {
            (w.starts_with("-c") && !w.starts_with("--"))
                || w.to_ascii_lowercase().contains("ciphers")
        })
        && cpu_has_aes()
}

/// Whether this CPU has AES instructions (`aes` among its flags).
/// Read once per process: every `Target` asks (each location, each
/// session), and the CPU does not change.
pub(super) fn cpu_has_aes() -> bool {
    static AES: OnceLock<bool> = OnceLock::new();
    *AES.get_or_init(|| {
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
            s.lines()
                .filter(|l| l.starts_with("flags") || l.starts_with("Features"))
                .any(|l| l.split_whitespace().any(|w| w == "aes"))
        })
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
