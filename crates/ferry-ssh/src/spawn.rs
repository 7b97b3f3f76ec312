//! Running ssh for a session, the one place ferry-ssh's connections and
//! ferry-sftp's sessions both take it from: the process with its stdin
//! and stdout (grown pipes, or one socket pair), the last lines of its
//! stderr kept for the message of a session that failed, reaping it, and
//! what a failed or lost session is called ([`classify`], [`lost`]).

use parking_lot::Mutex;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::conn::Target;
use crate::quiet::Quiet;
use crate::SessionError;

/// Bytes the pipes to and from ssh hold (the kernel's default is 64 KiB):
/// room for whole chunks while the other side is busy. `ferry serve`
/// grows its stdin and stdout the same.
pub const PIPE_BYTES: usize = 1 << 20;
/// Socket buffer bytes each way between ferry and ssh (as its pipes are
/// grown to).
pub const SOCKET_BYTES: usize = 1 << 20;
/// Lines of ssh's stderr kept for the message of a failed session.
const TAIL: usize = 20;

/// Give a pipe [`PIPE_BYTES`] of room (a hint: not a pipe, or a limit
/// below it, and it stays as it is).
pub fn grow_pipe(fd: BorrowedFd<'_>) {
    let _ = rustix::pipe::fcntl_setpipe_size(fd, PIPE_BYTES);
}

/// The last lines ssh wrote to its stderr (what ssh or the remote said).
#[derive(Clone, Default)]
pub struct Tail(Arc<Mutex<Vec<String>>>);

impl Tail {
    /// The lines kept, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().clone()
    }

    /// The last line.
    pub fn last(&self) -> Option<String> {
        self.0.lock().last().cloned()
    }

    /// Keep the last lines of `pipe` until it ends (a thread of its own).
    fn keep(pipe: impl Read + Send + 'static) -> (Tail, JoinHandle<()>) {
        let tail = Tail::default();
        let t = tail.clone();
        let h = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut v = t.0.lock();
                if v.len() == TAIL {
                    v.remove(0);
                }
                v.push(line);
            }
        });
        (tail, h)
    }
}

/// How ssh's stdin and stdout are given to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    /// Two pipes, grown to [`PIPE_BYTES`].
    Pipes,
    /// One socket pair, as OpenSSH's own scp and sftp give it (pipes when
    /// a pair cannot be made).
    SocketPair,
}

/// ssh, started: its process, this end's streams to it, its stderr's
/// last lines (read by `errt`).
pub struct Ssh {
    /// The process.
    pub child: Child,
    /// What is written to ssh's stdin.
    pub stdin: File,
    /// What ssh writes to its stdout.
    pub stdout: File,
    /// Its stderr's last lines.
    pub tail: Tail,
    /// The thread reading its stderr (ends with ssh).
    pub errt: JoinHandle<()>,
}

/// Start `argv` (ssh, or the `-e` command, and its arguments) with its
/// stdin and stdout as `io` says and its stderr kept.
pub fn spawn(argv: &[String], io: Io) -> Result<Ssh, SessionError> {
    let sock = match io {
        Io::SocketPair => std::os::unix::net::UnixStream::pair().ok().inspect(|pair| {
            for f in [&pair.0, &pair.1] {
                let _ = rustix::net::sockopt::set_socket_send_buffer_size(f, SOCKET_BYTES);
                let _ = rustix::net::sockopt::set_socket_recv_buffer_size(f, SOCKET_BYTES);
            }
        }),
        Io::Pipes => None,
    };
    let cannot = |e: io::Error| format!("cannot run {:?} (the -e/FERRY_RSH command): {e}", argv[0]);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stderr(Stdio::piped());
    match &sock {
        Some((_, theirs)) => {
            let end = || theirs.try_clone().map(|s| Stdio::from(OwnedFd::from(s)));
            cmd.stdin(end().map_err(cannot)?)
                .stdout(end().map_err(cannot)?);
        }
        None => {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        }
    }
    // (`cmd` holds ssh's ends of the pair until it is dropped: they must be
    // ssh's alone, or its exit never reads as the end of its output here.)
    let mut child = cmd.spawn().map_err(cannot)?;
    drop(cmd);
    let (tail, errt) = Tail::keep(child.stderr.take().expect("piped"));
    let (stdin, stdout) = match sock {
        Some((ours, theirs)) => {
            drop(theirs);
            let w = ours.try_clone().map_err(|e| e.to_string())?;
            (
                File::from(OwnedFd::from(w)),
                File::from(OwnedFd::from(ours)),
            )
        }
        None => {
            let stdin = child.stdin.take().expect("piped");
            let stdout = child.stdout.take().expect("piped");
            grow_pipe(stdin.as_fd());
            grow_pipe(stdout.as_fd());
            (
                File::from(OwnedFd::from(stdin)),
                File::from(OwnedFd::from(stdout)),
            )
        }
    };
    Ok(Ssh {
        child,
        stdin,
        stdout,
        tail,
        errt,
    })
}

/// Stop a session that is not wanted (it answered out of protocol, or
/// as another program): ssh killed and waited for.
pub fn kill(child: &mut Child, quiet: &Quiet) {
    let _ = child.kill();
    quiet.reaped();
    quiet.stop();
    let _ = child.wait();
}

/// Wait for ssh once its session's stream ended (killed first when
/// `kill`), and for its stderr to be read: its exit status.
pub fn reap(child: &mut Child, errt: JoinHandle<()>, quiet: &Quiet, kill: bool) -> Option<i32> {
    if kill {
        let _ = child.kill();
    }
    quiet.reaped();
    quiet.stop();
    let status = child.wait().ok().and_then(|s| s.code());
    let _ = errt.join();
    status
}

/// Why a session that had started ended: `what` ("connection lost"),
/// the read error that ended it, what ssh said last or its status. A
/// session given up for silence (`--timeout`) says that instead.
pub fn lost(
    host: &str,
    what: &str,
    end: Option<io::Error>,
    tail: &Tail,
    status: Option<i32>,
    quiet: &Quiet,
) -> String {
    if let Some(why) = quiet.fired() {
        // Given up for silence: that is the cause (ssh was killed for it).
        return why;
    }
    let mut why = format!("{host}: {what}");
    if let Some(e) = end {
        why.push_str(&format!(" ({e})"));
    }
    match (tail.last(), status) {
        (Some(l), _) => why.push_str(&format!(" (ssh: {l})")),
        (None, Some(c)) => why.push_str(&format!(" (ssh exited with status {c})")),
        _ => {}
    }
    why
}

/// A session that ended before it started: ssh waited for, then why, as
/// [`classify`] says it (or the `--timeout` that gave it up: `Err`).
pub fn ended(
    t: &Target,
    child: &mut Child,
    errt: JoinHandle<()>,
    tail: &Tail,
    quiet: &Quiet,
) -> Result<(String, Vec<String>), SessionError> {
    let status = reap(child, errt, quiet, false);
    if let Some(why) = quiet.fired() {
        return Err(SessionError(why));
    }
    let lines = tail.lines();
    Ok((classify(t, status, &lines), lines))
}

/// What [`classify`] says when the remote has no ferry.
pub(crate) const NO_FERRY: &str = "no ferry on the remote";

/// True when `why`, a message of [`classify`] (or of a connection that
/// did not start), says ssh itself failed (unreachable, authentication,
/// host key, no ssh, no answer for `--timeout`): the host was not
/// reached, so nothing else over ssh can work either.
pub fn is_ssh_failure(why: &str) -> bool {
    [
        ": host key verification failed:",
        ": authentication failed:",
        ": host unreachable (",
        ": ssh failed: ",
        "(the -e/FERRY_RSH command)",
        // Given up for silence (`--timeout`): the host did not answer,
        // which is not a host where ferry cannot run.
        " s (--timeout)",
    ]
    .iter()
    .any(|s| why.contains(s))
}

/// One line for a session that did not start: what ssh or the remote said.
pub fn classify(t: &Target, code: Option<i32>, tail: &[String]) -> String {
    let h = &t.host;
    let all = tail.join("\n");
    let last = tail
        .iter()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .unwrap_or_default();
    let has = |s: &str| all.contains(s);
    if has("REMOTE HOST IDENTIFICATION HAS CHANGED") || has("has changed and you have requested") {
        // ssh names the command that forgets the old key.
        let forget = tail
            .iter()
            .find(|l| l.contains("ssh-keygen") && l.contains(" -R "))
            .map_or_else(
                || "ssh-keygen -R HOST".to_string(),
                |l| l.trim().to_string(),
            );
        return format!("{h}: host key verification failed: the host's key changed: it is not the one known_hosts has for it (a reinstalled host, or someone in between); if the change is expected, forget the old key ({forget}) and connect once with ssh to check and accept the new one");
    }
    if has("host key is known for") || has("Host key verification failed") {
        return format!("{h}: host key verification failed: known_hosts has no key for this host (never connected): connect once with ssh to check and accept its key, then run ferry again (ssh: {last})");
    }
    if has("Permission denied") || has("Too many authentication failures") {
        return format!("{h}: authentication failed: the host refused every key or password ssh offered: check the user name, and that your key is in the host's authorized_keys (ssh-copy-id) or loaded in your agent (ssh: {last})");
    }
    for s in [
        "Could not resolve hostname",
        "Connection refused",
        "timed out",
        "No route to host",
        "Network is unreachable",
        "Connection closed by",
        "Connection reset",
        "kex_exchange_identification",
    ] {
        if has(s) {
            return format!("{h}: host unreachable (ssh: {last})");
        }
    }
    if code == Some(127)
        || has("command not found")
        || has(": not found")
        || has("No such file or directory")
    {
        return format!(
            "{h}: {NO_FERRY} (`{} serve`: {last}); install ferry there or name it with --remote-ferry PATH",
            t.remote_ferry
        );
    }
    match code {
        Some(255) => format!("{h}: ssh failed: {last}"),
        Some(c) => format!(
            "{h}: `{} serve` exited with status {c} before answering: {last}",
            t.remote_ferry
        ),
        None => format!("{h}: the connection ended before ferry serve answered: {last}"),
    }
}
