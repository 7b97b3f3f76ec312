//! One connection to a `ferry serve`: the system `ssh` (or the `-e`
//! command) as a child process, a writer thread feeding its stdin and a
//! reader thread taking replies from its stdout and handing each to the
//! request of its id. Any number of threads call at once; each blocks only
//! on its own reply.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

use crate::spawn::{self, NO_FERRY};
pub use crate::spawn::{classify, is_ssh_failure};

use crate::install::{Look, Report};
use crate::proto::{self, Hello, Out, Req, Resp};
use crate::quiet::{self, Quiet, Reading, Session, Writing};

/// Frames queued for the writer thread at most (a big file's chunks wait
/// for room: memory stays bounded).
const QUEUED: usize = 64;
/// Buffers of big replies kept for reuse at most ([`Conn::recycle`]).
const RECYCLED: usize = 16;

/// How to reach a host: the command, the host and port, the remote binary.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// The remote shell command, split into words (`ssh`, `-e` or
    /// `FERRY_RSH`).
    pub rsh: Vec<String>,
    /// `[user@]host`.
    pub host: String,
    /// A port given in an `ssh://` URL.
    pub port: Option<u16>,
    /// The command that runs ferry on the remote (`--remote-ferry`).
    pub remote_ferry: String,
    /// Whether this binary may be installed on the remote when it has no
    /// ferry of this protocol (no `--remote-ferry`, no
    /// `--no-remote-install`).
    pub install: bool,
    /// Options put before the host: AES-GCM first when ssh would use its
    /// built-in cipher order ([`fast_cipher`]).
    pub options: Vec<String>,
}

/// This run's settings for SSH locations.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `-e/--rsh` (unset: `FERRY_RSH`, or `ssh`).
    pub rsh: Option<String>,
    /// `--remote-ferry` (unset: `ferry`, installed when missing).
    pub remote_ferry: Option<String>,
    /// `--connections` (unset: from the cores of both ends).
    pub connections: Option<u16>,
    /// `--no-remote-install`.
    pub no_remote_install: bool,
    /// What the command line asks for that only ferry on the remote keeps
    /// (`-H (hard links)`, ...): where ferry cannot run, the run stops
    /// rather than go over SFTP without it.
    pub only_ferry_keeps: Vec<String>,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Make `s` this run's settings.
pub fn configure(s: Settings) {
    let _ = SETTINGS.set(s);
}

/// This run's settings.
pub fn settings() -> Settings {
    SETTINGS.get().cloned().unwrap_or_default()
}

/// Connections per host at most when `--connections` is not given.
const DEFAULT_CONNECTIONS: usize = 4;

impl Target {
    /// The target for `host` (`[user@]host`, brackets around an IPv6
    /// address allowed) and `port`, with this run's settings.
    pub fn new(host: &str, port: Option<u16>) -> Result<Target, String> {
        let set = SETTINGS.get().cloned().unwrap_or_default();
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
            return Err(format!("{host:?}: not a host name"));
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
        })
    }

    fn argv(&self) -> Vec<String> {
        self.command(&format!("{} serve", self.remote_ferry))
    }

    /// The command line of a connection: `--remote-ferry`'s, or with
    /// self-install, the start command that looks for ferry as `look`
    /// says ([`crate::install::start_script`]; `sum`: the shipped binary's
    /// SHA-256, for [`Look::Verify`]).
    fn argv_look(&self, look: Look, sum: &str) -> Result<Vec<String>, String> {
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
fn fast_cipher(rsh: &[String], host: &str, port: Option<u16>) -> Option<String> {
    // Asked once per command, host and port in a run: every location and
    // every session to a host makes its `Target` (a second `ssh -G`, the
    // connection's set-up waiting on it, was 20-30 ms of each run).
    type Asked = (Vec<String>, String, Option<u16>);
    static ASKED: Mutex<Vec<(Asked, Option<String>)>> = Mutex::new(Vec::new());
    let key = (rsh.to_vec(), host.to_string(), port);
    let mut asked = ASKED.lock().unwrap();
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
fn cpu_has_aes() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
        s.lines()
            .filter(|l| l.starts_with("flags") || l.starts_with("Features"))
            .any(|l| l.split_whitespace().any(|w| w == "aes"))
    })
}

/// Words of a command line, as a shell splits them: blanks separate,
/// single and double quotes group, a backslash escapes the next character.
pub fn split_words(s: &str) -> Result<Vec<String>, String> {
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

/// The error of a request whose connection is gone: a run reports these
/// once, with a count, not one line per entry.
#[derive(Debug)]
pub struct Lost(pub String);

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Lost {}

impl Lost {
    /// True when `e` is (or carries) a [`Lost`].
    pub fn is(e: &io::Error) -> bool {
        e.get_ref()
            .is_some_and(|i| i.downcast_ref::<Lost>().is_some())
    }
}

type Slot = SyncSender<io::Result<Vec<u8>>>;

#[derive(Default)]
struct Pending {
    calls: HashMap<u64, Slot>,
    /// Requests answered by any number of replies ([`Conn::stream`]).
    streams: HashMap<u64, mpsc::Sender<io::Result<Vec<u8>>>>,
    /// Why the connection is gone, once it is.
    dead: Option<String>,
}

/// A live connection.
pub struct Conn {
    host: String,
    tx: SyncSender<Out>,
    pending: Mutex<Pending>,
    next: AtomicU64,
    /// Set once the connection is gone (read without a lock).
    gone: AtomicBool,
    /// The server runs as root.
    pub root: bool,
    /// The server's cores.
    pub cores: usize,
    /// How it was reached (the remote ferry found or installed).
    target: Target,
    /// Further connections to the same host for big files, opened when
    /// first needed (`None`: not yet).
    extra: Mutex<Vec<Option<Arc<Conn>>>>,
    /// Set by [`close_all`]: the end of the stream is expected.
    closing: AtomicBool,
    /// Set (and notified) once ssh has exited and been waited for.
    closed: (Mutex<bool>, Condvar),
    /// The I/O timeout's watch (`--timeout`).
    quiet: Arc<Quiet>,
    /// Buffers of big replies given back ([`Conn::recycle`]).
    bufs: Mutex<Vec<Vec<u8>>>,
    /// Set once a call's round trip was measured ([`round_trip`]).
    timed: AtomicBool,
}

impl Session for Conn {
    fn waiting(&self) -> bool {
        !self.pending.lock().unwrap().calls.is_empty()
    }

    fn give_up(&self, why: String) {
        self.die(why);
    }
}

/// A reply's bytes, decoded on demand (byte strings borrowed from them).
pub struct Body(pub Vec<u8>);

impl Body {
    /// The reply's message bytes: past the room a big [`Resp::Data`] was
    /// placed after ([`proto::PLACED`]), so that its data sits aligned.
    pub fn bytes(&self) -> &[u8] {
        match self.0.first() {
            Some(&proto::PLACED) if self.0.len() >= 3 => {
                &self.0[usize::from(u16::from_le_bytes([self.0[1], self.0[2]]))..]
            }
            _ => &self.0,
        }
    }

    /// The reply; a reply that is an error becomes `Err`.
    pub fn get(&self) -> io::Result<Resp<'_>> {
        match proto::decode(self.bytes())? {
            Resp::Err(e) => Err(e.into()),
            r => Ok(r),
        }
    }
}

/// A reply the caller did not expect.
pub fn unexpected(r: &Resp<'_>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected reply from ferry serve: {r:?}"),
    )
}

impl Conn {
    fn lost(&self) -> io::Error {
        let why = self.pending.lock().unwrap().dead.clone();
        lost_error(why.unwrap_or_else(|| format!("{}: connection lost", self.host)))
    }

    /// `Err` once the connection is gone: work that would end in a request
    /// (reading a source file for it) is not started.
    pub fn alive(&self) -> io::Result<()> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(self.lost());
        }
        Ok(())
    }

    /// Send a message that gets no reply.
    pub fn send(&self, req: &Req<'_>) -> io::Result<()> {
        self.tx
            .send(proto::frame(0, req).into())
            .map_err(|_| self.lost())
    }

    /// Send a frame built by the caller (a [`Out::Piped`] one) that gets
    /// no reply.
    pub fn send_out(&self, out: Out) -> io::Result<()> {
        self.tx.send(out).map_err(|_| self.lost())
    }

    /// Send a request; its reply comes on the receiver.
    pub fn start(&self, req: &Req<'_>) -> io::Result<Receiver<io::Result<Vec<u8>>>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (stx, srx) = mpsc::sync_channel(1);
        {
            let mut p = self.pending.lock().unwrap();
            if let Some(why) = &p.dead {
                return Err(lost_error(why.clone()));
            }
            if p.calls.is_empty() {
                // Waiting starts now (the I/O timeout counts from here).
                self.quiet.touch();
            }
            p.calls.insert(id, stx);
        }
        if self.tx.send(proto::frame(id, req).into()).is_err() {
            self.pending.lock().unwrap().calls.remove(&id);
            return Err(self.lost());
        }
        Ok(srx)
    }

    /// Send a request answered by any number of replies, each handed to
    /// the receiver as it comes, until the connection ends (then an error).
    pub fn stream(&self, req: &Req<'_>) -> io::Result<mpsc::Receiver<io::Result<Vec<u8>>>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (stx, srx) = mpsc::channel();
        {
            let mut p = self.pending.lock().unwrap();
            if let Some(why) = &p.dead {
                return Err(lost_error(why.clone()));
            }
            p.streams.insert(id, stx);
        }
        if self.tx.send(proto::frame(id, req).into()).is_err() {
            self.pending.lock().unwrap().streams.remove(&id);
            return Err(self.lost());
        }
        Ok(srx)
    }

    /// Wait for a reply started with [`Conn::start`].
    pub fn wait(&self, rx: &Receiver<io::Result<Vec<u8>>>) -> io::Result<Body> {
        match rx.recv() {
            Ok(r) => r.map(Body),
            Err(_) => Err(self.lost()),
        }
    }

    /// Send a request and wait for its reply.
    pub fn call(&self, req: &Req<'_>) -> io::Result<Body> {
        let asked = std::time::Instant::now();
        let rx = self.start(req)?;
        let r = self.wait(&rx);
        // The first call's round trip is the connection's (its first
        // answer came with the hello: no round trip of its own).
        if r.is_ok() && !self.timed.swap(true, Ordering::Relaxed) {
            let rtt = asked.elapsed().as_micros().max(1) as u64;
            RTT_US.fetch_max(rtt, Ordering::Relaxed);
        }
        r
    }

    /// Give back the bytes of a reply read (a [`Body`]'s), for the next
    /// big reply to be read into (not allocated and zeroed again).
    pub fn recycle(&self, b: Vec<u8>) {
        if b.capacity() == proto::PLACED_BUF {
            let mut bufs = self.bufs.lock().unwrap();
            if bufs.len() < RECYCLED {
                bufs.push(b);
            }
        }
    }

    /// A new handle number.
    pub fn handle(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// How many connections big files use: `--connections`, or the
    /// fewest cores of the two ends (one ssh stream is bound to one core
    /// by its cipher), up to [`DEFAULT_CONNECTIONS`].
    pub fn width(&self) -> usize {
        let set = SETTINGS.get().cloned().unwrap_or_default();
        match set.connections {
            Some(n) => usize::from(n).max(1),
            None => {
                let here = std::thread::available_parallelism().map_or(1, |n| n.get());
                here.min(self.cores).clamp(1, DEFAULT_CONNECTIONS)
            }
        }
    }

    /// Connection `k` (0 is this one) of [`Conn::width`], opened now if it
    /// is not yet; this one when another cannot be opened (the work goes
    /// on, on fewer connections).
    pub fn nth(self: &Arc<Conn>, k: usize) -> Arc<Conn> {
        crate::extra::nth(
            self,
            &self.extra,
            k,
            |c| c.gone.load(Ordering::Relaxed),
            || open(&self.target).ok(),
        )
    }

    fn die(&self, why: String) {
        let (calls, streams) = {
            let mut p = self.pending.lock().unwrap();
            p.dead.get_or_insert(why.clone());
            (std::mem::take(&mut p.calls), std::mem::take(&mut p.streams))
        };
        self.gone.store(true, Ordering::Relaxed);
        for (_, slot) in calls {
            let _ = slot.send(Err(lost_error(why.clone())));
        }
        for (_, s) in streams {
            let _ = s.send(Err(lost_error(why.clone())));
        }
    }
}

fn lost_error(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, Lost(why))
}

/// The longest round trip measured on this run's connections, in µs.
static RTT_US: AtomicU64 = AtomicU64::new(0);

/// This process only reads: every server is told so ([`read_only`]).
static READ_ONLY: AtomicBool = AtomicBool::new(false);

/// This process only reads (`ferry ls`, `ferry versions`, a dry run):
/// every `ferry serve` it starts acts on no rollback record.
pub fn read_only() {
    READ_ONLY.store(true, Ordering::Relaxed);
}

/// Whether this process only reads ([`read_only`]): a store over ssh
/// then asks only what changes nothing there.
pub fn is_read_only() -> bool {
    READ_ONLY.load(Ordering::Relaxed)
}

/// The longest round trip to a host of this run (the first request's,
/// measured when its connection was made); `None` before any connection.
pub fn round_trip() -> Option<std::time::Duration> {
    match RTT_US.load(Ordering::Relaxed) {
        0 => None,
        us => Some(std::time::Duration::from_micros(us)),
    }
}

/// Count `d`, a round trip measured on another kind of session to a host
/// of this run (an SFTP session's first request), in [`round_trip`].
pub fn note_round_trip(d: std::time::Duration) {
    RTT_US.fetch_max(d.as_micros().max(1) as u64, Ordering::Relaxed);
}

/// This run's connections, one per target.
static CONNS: Mutex<Vec<(Target, Arc<Conn>)>> = Mutex::new(Vec::new());

/// This run's watch connections ([`crate::watch`]), each of its own.
static WATCHES: Mutex<Vec<Arc<Conn>>> = Mutex::new(Vec::new());

/// A connection of its own to `t` for a request that never ends (a
/// watch), closed by [`close_all`] with the others.
pub(crate) fn open_own(t: &Target) -> Result<Arc<Conn>, String> {
    let c = open(t).map_err(|f| f.line(t))?;
    let mut w = WATCHES.lock().unwrap();
    w.retain(|c| !c.gone.load(Ordering::Relaxed));
    w.push(c.clone());
    Ok(c)
}

impl Conn {
    /// How this connection reached its host (the remote ferry found or
    /// installed).
    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// End the session: its input closed, so `ferry serve` and ssh exit.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        let _ = self.tx.send(Vec::new().into());
    }
}

/// End this run's sessions: close each connection's input, so that its
/// `ferry serve` and then ssh exit, and wait for them (a few seconds at
/// most), so that a run leaves no ssh behind it.
pub fn close_all() {
    let conns: Vec<Arc<Conn>> = CONNS
        .lock()
        .unwrap()
        .drain(..)
        .flat_map(|(_, c)| {
            let extra: Vec<Arc<Conn>> = c.extra.lock().unwrap().drain(..).flatten().collect();
            std::iter::once(c).chain(extra)
        })
        .chain(WATCHES.lock().unwrap().drain(..))
        .collect();
    for c in &conns {
        c.closing.store(true, Ordering::Relaxed);
        // An empty frame tells the writer to close the stream.
        let _ = c.tx.send(Vec::new().into());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    for c in &conns {
        let (lock, cv) = &c.closed;
        let mut done = lock.lock().unwrap();
        while !*done {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            done = cv.wait_timeout(done, left).unwrap().0;
        }
    }
}

/// The connection to `t`, made once per run and shared. With self-install
/// one connection runs the start command ([`crate::install`]): it execs
/// the ferry there, or says what it found, in the same round trip. When
/// the remote has no ferry this binary may run, it is installed there
/// ([`crate::install::install`]) and run.
pub fn connect(t: &Target) -> Result<Arc<Conn>, String> {
    let mut conns = CONNS.lock().unwrap();
    if let Some((_, c)) = conns.iter().find(|(k, _)| k == t) {
        return Ok(c.clone());
    }
    let c = start(t)?;
    conns.push((t.clone(), c.clone()));
    Ok(c)
}

/// A session to `t`'s ferry: found, checked, or installed first.
fn start(t: &Target) -> Result<Arc<Conn>, String> {
    let mut look = Look::Fast;
    let mut why = format!("{}: {NO_FERRY} (none on the PATH, none cached)", t.host);
    let mut installed = false;
    // At most: the PATH's ferry of another protocol, a cached file
    // checked, an install, and the start after it.
    for _ in 0..5 {
        let sum = match look {
            Look::Verify => crate::install::shipped()?.sum.as_str(),
            _ => "",
        };
        let report = match open_look(t, look, sum) {
            Ok(c) => return Ok(c),
            Err(Failed::Other(w)) => return Err(w),
            Err(Failed::NoFerry(w)) if !t.install || look != Look::Fast => return Err(w),
            // The PATH's ferry is of another protocol (or not ferry): the
            // cache, or an install, as when there is none.
            Err(Failed::NoFerry(w)) => {
                why = w;
                look = Look::NoPath;
                continue;
            }
            Err(Failed::Report(r)) => r,
        };
        if report.cached {
            if let Some(s) = &report.cached_sum {
                let ship = crate::install::shipped()?;
                if *s != ship.sum {
                    let name = crate::install::cache_name()?;
                    return Err(crate::install::not_this(
                        t,
                        &format!("{}/{name}", report.dir),
                        s,
                    ));
                }
            }
            if look != Look::Verify {
                // There, but not as its marker says: its SHA-256 checked
                // there once.
                look = Look::Verify;
                continue;
            }
        }
        if installed {
            break;
        }
        crate::install::install(t, &report, &why)?;
        installed = true;
        look = Look::NoPath;
    }
    Err(Failed::Report(Report::default()).line(t))
}

/// A new connection in place of `dead`, this run's connection to `t`
/// that was lost: made as the first was (to the remote ferry found or
/// installed then, with its protocol check), and shared from now on. One
/// another store made again already is taken as it is. The lost one's
/// extra connections are closed (new ones are opened when needed).
pub fn reconnect(t: &Target, dead: &Arc<Conn>) -> Result<Arc<Conn>, String> {
    let mut conns = CONNS.lock().unwrap();
    if let Some(i) = conns.iter().position(|(k, _)| k == t) {
        let c = &conns[i].1;
        if !Arc::ptr_eq(c, dead) && !c.gone.load(Ordering::Relaxed) {
            return Ok(c.clone());
        }
        let (_, old) = conns.swap_remove(i);
        for e in old.extra.lock().unwrap().drain(..).flatten() {
            e.close();
        }
    }
    let c = open(dead.target()).map_err(|f| f.line(t))?;
    conns.push((t.clone(), c.clone()));
    Ok(c)
}

/// Why a session did not start.
enum Failed {
    /// The start command ran no ferry and said what it found.
    Report(Report),
    /// No ferry of this protocol answered (the message says which).
    NoFerry(String),
    /// Anything else (ssh could not connect, ...).
    Other(String),
}

impl Failed {
    fn line(self, t: &Target) -> String {
        match self {
            Failed::Other(w) | Failed::NoFerry(w) => w,
            Failed::Report(_) => format!("{}: {NO_FERRY} (none on the PATH, none cached)", t.host),
        }
    }
}

/// Another connection to a host reached before: its start command runs
/// the ferry it found then.
fn open(t: &Target) -> Result<Arc<Conn>, Failed> {
    open_look(t, Look::Fast, "")
}

fn open_look(t: &Target, look: Look, sum: &str) -> Result<Arc<Conn>, Failed> {
    let argv = t.argv_look(look, sum).map_err(Failed::Other)?;
    let ssh = spawn::spawn(&argv, spawn::Io::Pipes).map_err(Failed::Other)?;
    let quiet = Quiet::start(
        ssh.child.id(),
        format!("{}: connection lost: no answer from ferry serve", t.host),
    );
    let mut start = Starting {
        t,
        child: ssh.child,
        errt: Some(ssh.errt),
        tail: ssh.tail,
        quiet: quiet.clone(),
    };
    let mut stdin = Writing {
        inner: ssh.stdin,
        quiet: quiet.clone(),
    };
    let mut stdout = Reading {
        inner: ssh.stdout,
        quiet: quiet.clone(),
    };
    // The hello and the first requests in one write, before the other
    // end's hello is read: a server reads requests only once it has
    // checked the hello's protocol, and a start command that runs no
    // ferry reads none. So the server's answers (its cores, whether it
    // keeps owners) cost no round trip of their own.
    let _ = stdin.write_all(&first_words()).and_then(|()| stdin.flush());
    if let Err(n) = start.hello(&mut stdout) {
        // (Its input closed before ssh is waited for.)
        drop(stdin);
        return Err(start.settle(n));
    }
    let (tx, rx) = mpsc::sync_channel::<Out>(QUEUED);
    std::thread::spawn(move || proto::write_out(stdin, rx));
    // Whether the server keeps owners and its cores, asked with the hello:
    // this first reply is read here, before the reader runs.
    let (root, cores) = match start.info(&mut stdout) {
        Ok(info) => info,
        Err(n) => {
            drop(tx);
            return Err(start.settle(n));
        }
    };
    let conn = Arc::new(Conn {
        host: t.host.clone(),
        tx,
        pending: Mutex::new(Pending::default()),
        next: AtomicU64::new(1),
        gone: AtomicBool::new(false),
        root,
        cores,
        target: t.clone(),
        extra: Mutex::new(Vec::new()),
        closing: AtomicBool::new(false),
        closed: (Mutex::new(false), Condvar::new()),
        quiet: quiet.clone(),
        bufs: Mutex::new(Vec::new()),
        timed: AtomicBool::new(false),
    });
    quiet.attach(Arc::downgrade(&conn) as std::sync::Weak<dyn Session>);
    let c = conn.clone();
    let (child, tail) = (start.child, start.tail);
    let errt = start.errt.take().expect("not reaped");
    std::thread::spawn(move || read_replies(&c, stdout, child, tail, errt));
    Ok(conn)
}

/// What a connection writes first: the hello, this run's read-only flag,
/// the heartbeat request and the Info request (answered with the hello).
fn first_words() -> Vec<u8> {
    let mut first = Vec::with_capacity(128);
    let _ = proto::write_hello(&mut first);
    if READ_ONLY.load(Ordering::Relaxed) {
        first.extend(proto::frame(0, &Req::ReadOnly));
    }
    // A heartbeat from the server while it works on a long request (a
    // signature of a huge file, a big removal), a few per timeout.
    let every = (quiet::timeout() / 3).as_millis().max(1) as u64;
    first.extend(proto::frame(0, &Req::KeepAlive { ms: every }));
    first.extend(proto::frame(u64::MAX, &Req::Info));
    first
}

/// Why a connection did not start, before ssh is waited for.
enum NoHello {
    /// Not wanted (kill ssh): this is why.
    Kill(Failed),
    /// The start command's report: it exits on its own.
    Report(Report),
    /// The stream ended: why, from ssh's stderr once it exits.
    Ended,
}

/// A connection being started: its ssh, until the session runs.
struct Starting<'a> {
    t: &'a Target,
    child: Child,
    errt: Option<JoinHandle<()>>,
    tail: spawn::Tail,
    quiet: Arc<Quiet>,
}

impl Starting<'_> {
    /// ssh killed or waited for, as `n` says, and why the session did not
    /// start.
    fn settle(&mut self, n: NoHello) -> Failed {
        let errt = self.errt.take().expect("not reaped");
        match n {
            NoHello::Kill(f) => {
                spawn::kill(&mut self.child, &self.quiet);
                drop(errt);
                f
            }
            NoHello::Report(r) => {
                spawn::reap(&mut self.child, errt, &self.quiet, false);
                Failed::Report(r)
            }
            NoHello::Ended => {
                match spawn::ended(self.t, &mut self.child, errt, &self.tail, &self.quiet) {
                    Err(timed_out) => Failed::Other(timed_out),
                    Ok((why, _)) if why.contains(NO_FERRY) => Failed::NoFerry(why),
                    Ok((why, _)) => Failed::Other(why),
                }
            }
        }
    }

    /// Read the other end's hello: `ferry serve` of this protocol, or why
    /// not (the start command's report, another ferry, another program).
    fn hello(&mut self, stdout: &mut impl Read) -> Result<(), NoHello> {
        let t = self.t;
        match proto::read_hello(stdout) {
            Ok(Hello::Ferry { protocol, .. }) if protocol == proto::PROTOCOL => Ok(()),
            Ok(Hello::Ferry { protocol, version }) => Err(NoHello::Kill(Failed::NoFerry(format!(
                "{}: the remote ferry ({}) is version {version} (protocol {protocol}), this is {} (protocol {}): install ferry {} there, or name one with --remote-ferry PATH",
                t.host, t.remote_ferry, proto::version(), proto::PROTOCOL, proto::version()
            )))),
            Ok(Hello::Other(b)) if b.starts_with(b"#") => {
                // The start command's report (or what else it said).
                let mut text = b;
                let _ = stdout.read_to_end(&mut text);
                let text = String::from_utf8_lossy(&text).into_owned();
                Err(match text.strip_prefix(crate::install::PROBE) {
                    Some(rest) => NoHello::Report(Report::parse(rest)),
                    None => NoHello::Ended,
                })
            }
            Ok(Hello::Other(b)) => Err(NoHello::Kill(Failed::NoFerry(format!(
                "{}: `{} serve` did not answer as ferry serve does (it wrote {:?}); name ferry there with --remote-ferry PATH",
                t.host,
                t.remote_ferry,
                String::from_utf8_lossy(&b)
            )))),
            Err(_) => Err(NoHello::Ended),
        }
    }

    /// The answer to the Info request sent with the hello: whether the
    /// server runs as root, and its cores.
    fn info(&self, stdout: &mut impl Read) -> Result<(bool, usize), NoHello> {
        let Some((_, body)) = proto::read_frame(stdout).ok().flatten() else {
            return Err(NoHello::Ended);
        };
        match Body(body).get() {
            Ok(Resp::Info { root, cores }) => Ok((root, (cores as usize).max(1))),
            _ => Err(NoHello::Kill(Failed::Other(format!(
                "{}: ferry serve answered out of protocol",
                self.t.host
            )))),
        }
    }
}

fn read_replies(
    conn: &Conn,
    stdout: Reading<std::fs::File>,
    mut child: Child,
    tail: spawn::Tail,
    errt: JoinHandle<()>,
) {
    // A small buffer: a big reply's data is read past it, into its place
    // ([`proto::read_placed`]).
    let mut r = BufReader::with_capacity(64 << 10, stdout);
    let end = loop {
        let spare = || conn.bufs.lock().unwrap().pop();
        match proto::read_placed(&mut r, spare) {
            Ok(Some((id, body))) => {
                let mut p = conn.pending.lock().unwrap();
                if let Some(s) = p.calls.remove(&id) {
                    drop(p);
                    let _ = s.send(Ok(body));
                } else if let Some(s) = p.streams.get(&id) {
                    let _ = s.send(Ok(body));
                }
            }
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    // The stream ended: say why, with what ssh said last. (At the end of
    // a run, ssh is exiting on its own: waited for, not killed.)
    let closing = conn.closing.load(Ordering::Relaxed);
    let status = spawn::reap(&mut child, errt, &conn.quiet, !closing);
    {
        let (lock, cv) = &conn.closed;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
    let why = spawn::lost(
        &conn.host,
        "connection lost",
        end,
        &tail,
        status,
        &conn.quiet,
    );
    conn.die(why);
}

/// True when `why`, a message of [`connect`] for a session that did not
/// start, says that ferry cannot run on the host (none there, none
/// installed: `--no-remote-install`, another OS or architecture, a server
/// that runs no commands), where SFTP may serve the host instead. False
/// when ssh itself failed, and when ferry refused: a cached file of its
/// name that is not this binary ([`crate::install::NOT_THIS`]) is told
/// and the run stops, as docs/CLI.md says.
pub fn ferry_cannot_run(why: &str) -> bool {
    !is_ssh_failure(why) && !why.contains(crate::install::NOT_THIS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_split_as_a_shell_does() {
        let w = |s: &str| split_words(s).unwrap();
        assert_eq!(w("ssh -p 2222  -F cfg"), ["ssh", "-p", "2222", "-F", "cfg"]);
        assert_eq!(
            w(r#"ssh -o 'A B' "c \"d\"" e\ f ''"#),
            ["ssh", "-o", "A B", "c \"d\"", "e f", ""]
        );
        assert!(split_words("ssh 'x").is_err());
        let t = Target {
            rsh: w("ssh -F c"),
            host: "u@h".into(),
            port: Some(22),
            remote_ferry: "/opt/ferry".into(),
            install: false,
            options: vec!["-o".into(), "Ciphers=x".into()],
        };
        assert_eq!(
            t.argv(),
            [
                "ssh",
                "-F",
                "c",
                "-p",
                "22",
                "-o",
                "Ciphers=x",
                "u@h",
                "/opt/ferry serve"
            ]
        );
        assert_eq!(
            t.subsystem("sftp"),
            [
                "ssh",
                "-F",
                "c",
                "-s",
                "-p",
                "22",
                "-o",
                "Ciphers=x",
                "u@h",
                "sftp"
            ]
        );
    }

    #[test]
    fn aes_gcm_goes_first_only_where_ssh_is_left_to_its_defaults() {
        let w = |s: &str| split_words(s).unwrap();
        // Not OpenSSH's ssh, or a cipher named on its command line: untouched
        // (no `ssh -G` is run for these).
        assert_eq!(fast_cipher(&w("dbclient"), "h", None), None);
        assert_eq!(fast_cipher(&w("ssh -c aes256-ctr"), "h", None), None);
        assert_eq!(
            fast_cipher(&w("ssh -o Ciphers=aes256-ctr"), "h", None),
            None
        );
        if !cpu_has_aes() || Command::new("ssh").arg("-V").output().is_err() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("cfg");
        std::fs::write(&cfg, "Host chosen\n  Ciphers aes256-ctr\n").unwrap();
        let f = cfg.to_str().unwrap();
        // A configuration that chooses: untouched.
        assert_eq!(
            fast_cipher(&w(&format!("ssh -F {f}")), "chosen", None),
            None
        );
        // Defaults: the same ciphers, AES-GCM first.
        let c = fast_cipher(&w(&format!("ssh -F {f}")), "other", Some(2222)).unwrap();
        assert_eq!(
            c,
            "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr"
        );
    }

    #[test]
    fn failed_sessions_are_classified_from_what_ssh_said() {
        let t = Target {
            rsh: vec!["ssh".into()],
            host: "h".into(),
            port: None,
            remote_ferry: "ferry".into(),
            install: true,
            options: Vec::new(),
        };
        let c = |code, l: &str| classify(&t, Some(code), &[l.to_string()]);
        assert!(c(
            255,
            "ssh: Could not resolve hostname h: Name or service not known"
        )
        .contains("host unreachable"));
        assert!(c(255, "u@h: Permission denied (publickey).").contains("authentication failed"));
        assert!(c(255, "Host key verification failed.").contains("host key verification failed"));
        // Unknown, changed, refused: each says what happened and what to do.
        let tl = |lines: &[&str]| {
            let v: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            classify(&t, Some(255), &v)
        };
        let unknown = tl(&[
            "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.",
            "Host key verification failed.",
        ]);
        assert!(
            unknown.contains("known_hosts has no key for this host"),
            "{unknown}"
        );
        assert!(!unknown.contains("not the one"), "{unknown}");
        let changed = tl(&[
            "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @",
            "  ssh-keygen -f \"/k\" -R \"[127.0.0.1]:2222\"",
            "Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.",
            "Host key verification failed.",
        ]);
        assert!(changed.contains("key changed"), "{changed}");
        assert!(changed.contains("ssh-keygen -f \"/k\" -R"), "{changed}");
        assert!(is_ssh_failure(&unknown) && is_ssh_failure(&changed));
        let refused = c(255, "u@h: Permission denied (publickey).");
        assert!(refused.contains("authorized_keys"), "{refused}");
        assert!(c(127, "bash: line 1: ferry: command not found").contains("no ferry on the remote"));
        assert!(c(1, "boom").contains("exited with status 1"));
        // What ssh failed at is told apart from what the remote could not run.
        assert!(is_ssh_failure(&c(
            255,
            "ssh: connect to host h port 22: Connection refused"
        )));
        assert!(is_ssh_failure(&c(
            255,
            "u@h: Permission denied (publickey)."
        )));
        assert!(is_ssh_failure(&c(255, "Host key verification failed.")));
        assert!(!is_ssh_failure(&c(127, "sh: 1: ferry: not found")));
        assert!(!is_ssh_failure(&c(1, "boom")));
    }
}
