//! The I/O timeout of a session over ssh (`--timeout`): a server that
//! sends nothing and takes nothing for that long while requests wait for
//! it (a `ferry serve` or `sftp-server` stopped, a host that froze, a
//! network that went away without a reset) is given up: ssh is killed,
//! every waiting request fails with one line naming the host and the
//! cause, and the run ends as for a lost connection.
//!
//! ssh's own `ServerAliveInterval` (off by default) cannot see this: its
//! probes are answered by sshd, which runs on while the program behind it
//! (`ferry serve`, `sftp-server`) is stopped; flow control then only
//! stops the stream, for ever. TCP keepalive takes hours.
//!
//! Progress is any byte read from the server or written to it (a slow link
//! that moves is never cut). A watcher thread per session sleeps until the
//! moment the limit would be reached (no timer on the data path: a read or
//! write costs one clock read and an atomic store). `ferry serve` sends a
//! heartbeat while it works on a long request ([`crate::proto::Req::KeepAlive`]),
//! so only a server that stopped is cut.

use parking_lot::{Condvar, Mutex};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The limit when `--timeout` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Milliseconds since this process first asked.
fn now_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// What the watcher asks of its session.
pub trait Session: Send + Sync {
    /// Whether a request waits for the server's answer.
    fn waiting(&self) -> bool;
    /// The session is given up: every waiting request fails with `why`.
    fn give_up(&self, why: String);
}

/// One session's watch.
pub struct Quiet {
    /// When a byte last moved (or waiting began), [`now_ms`].
    last: AtomicU64,
    /// A write to the server is under way (it may block).
    writing: AtomicBool,
    /// ssh's pid, until it is waited for (the pid is then no longer its).
    pid: Mutex<Option<u32>>,
    /// The session, once it is made (until then: its start waits).
    session: Mutex<Option<Weak<dyn Session>>>,
    /// The line, once the session was given up.
    fired: OnceLock<String>,
    /// Set when the session ended: the watcher stops.
    stopped: Mutex<bool>,
    wake: Condvar,
    /// What to say: `HOST: connection lost: no answer from ferry serve`.
    what: String,
}

impl Quiet {
    /// Watch the session of ssh `pid` from now on (its start counts as
    /// waiting), `what` the message's start, given up after `timeout`
    /// without a byte while requests wait (`--timeout`).
    pub fn start(pid: u32, what: String, timeout: Duration) -> Arc<Quiet> {
        let q = Arc::new(Quiet {
            last: AtomicU64::new(now_ms()),
            writing: AtomicBool::new(false),
            pid: Mutex::new(Some(pid)),
            session: Mutex::new(None),
            fired: OnceLock::new(),
            stopped: Mutex::new(false),
            wake: Condvar::new(),
            what,
        });
        let w = q.clone();
        std::thread::spawn(move || w.watch(timeout));
        q
    }

    /// The session is made: it says from now on whether requests wait.
    pub fn attach(&self, s: Weak<dyn Session>) {
        *self.session.lock() = Some(s);
    }

    /// A byte moved, or a request now waits where none did.
    pub fn touch(&self) {
        self.last.store(now_ms(), Ordering::Relaxed);
    }

    /// The line of a session given up for silence, if it was.
    pub fn fired(&self) -> Option<String> {
        self.fired.get().cloned()
    }

    /// ssh is about to be waited for: its pid is not killed after this.
    pub fn reaped(&self) {
        *self.pid.lock() = None;
    }

    /// The session ended: the watcher stops.
    pub fn stop(&self) {
        *self.stopped.lock() = true;
        self.wake.notify_all();
    }

    /// Whether the server is waited for; `None` once the session is
    /// gone (the watch ends).
    fn waiting(&self) -> Option<bool> {
        let s = match &*self.session.lock() {
            // Starting: the handshake waits for the server.
            None => return Some(true),
            Some(w) => w.upgrade()?,
        };
        Some(self.writing.load(Ordering::Relaxed) || s.waiting())
    }

    fn watch(&self, limit: Duration) {
        let limit_ms = limit.as_millis() as u64;
        let mut stopped = self.stopped.lock();
        loop {
            if *stopped {
                return;
            }
            let quiet = now_ms().saturating_sub(self.last.load(Ordering::Relaxed));
            if quiet >= limit_ms {
                match self.waiting() {
                    None => return,
                    Some(true) => break,
                    Some(false) => {}
                }
                // Idle: looked at again a whole limit later (waiting that
                // starts meanwhile is timed from its start).
                self.wake.wait_for(&mut stopped, limit);
            } else {
                let left = Duration::from_millis(limit_ms - quiet);
                self.wake.wait_for(&mut stopped, left);
            }
        }
        drop(stopped);
        let secs = limit.as_secs_f64();
        let why = format!("{} for {secs} s (--timeout)", self.what);
        let _ = self.fired.set(why.clone());
        if let Some(pid) = *self.pid.lock() {
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        let s = self.session.lock().clone();
        if let Some(s) = s.and_then(|w| w.upgrade()) {
            s.give_up(why);
        }
    }
}

/// The server's side of a session, every byte read counted as progress.
pub struct Reading<R> {
    /// The stream.
    pub inner: R,
    /// Its watch.
    pub quiet: Arc<Quiet>,
}

impl<R: Read> Read for Reading<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.quiet.touch();
        Ok(n)
    }
}

/// The stream to the server: a write under way is waiting for it, every
/// byte taken is progress.
pub struct Writing<W> {
    /// The stream.
    pub inner: W,
    /// Its watch.
    pub quiet: Arc<Quiet>,
}

impl<W: Write> Write for Writing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Timed from its start (the session may have been idle).
        self.quiet.touch();
        self.quiet.writing.store(true, Ordering::Relaxed);
        let r = self.inner.write(buf);
        self.quiet.writing.store(false, Ordering::Relaxed);
        self.quiet.touch();
        r
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: crate::splice::Sink> crate::splice::Sink for Writing<W> {
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.fd()
    }

    fn take(&mut self, p: &mut crate::splice::Pipe) -> io::Result<()> {
        // Timed as a write is.
        self.quiet.touch();
        self.quiet.writing.store(true, Ordering::Relaxed);
        let r = self.inner.take(p);
        self.quiet.writing.store(false, Ordering::Relaxed);
        self.quiet.touch();
        r
    }
}
