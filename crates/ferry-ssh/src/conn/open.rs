//! A connection's start: ssh spawned with the start command, the hello
//! and the first requests written at once, the other end's hello and
//! answers read, then the reader thread that hands each reply to its
//! request.

use parking_lot::{Condvar, Mutex};
use std::io::{BufReader, Read, Write};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use super::{Body, Conn, First, FirstDir, Pending, Target, QUEUED};
use crate::install::{Look, Report};
use crate::proto::{self, Hello, Out, Req, Resp};
use crate::quiet::{Quiet, Reading, Session, Writing};
use crate::spawn::{self, NO_FERRY};
use std::collections::HashMap;

/// Why a session did not start.
pub(super) enum Failed {
    /// The start command ran no ferry and said what it found.
    Report(Report),
    /// No ferry of this protocol answered (the message says which).
    NoFerry(String),
    /// Anything else (ssh could not connect, ...).
    Other(String),
}

impl Failed {
    pub(super) fn line(self, t: &Target) -> String {
        match self {
            Failed::Other(w) | Failed::NoFerry(w) => w,
            Failed::Report(_) => format!("{}: {NO_FERRY} (none on the PATH, none cached)", t.host),
        }
    }
}

/// Another connection to a host reached before: its start command runs
/// the ferry it found then.
pub(super) fn open(t: &Target) -> Result<Arc<Conn>, Failed> {
    open_look(t, Look::Fast, "", None)
}

/// A connection whose start command looks for ferry as `look` says
/// (`sum`: the SHA-256 a cached file is checked against); `walk`: a tree
/// the run walks there, listed ahead ([`Req::ListAhead`]).
pub(super) fn open_look(
    t: &Target,
    look: Look,
    sum: &str,
    walk: Option<&[u8]>,
) -> Result<Arc<Conn>, Failed> {
    let (argv, guessed) = t
        .argv_look(look, sum, walk)
        .map_err(|e| Failed::Other(e.0))?;
    let mut ssh = spawn::spawn(&argv, spawn::Io::Pipes).map_err(|e| Failed::Other(e.0))?;
    t.options.ask();
    // Started with the last run's cipher options while `ssh -G` answers
    // for this one: nothing is written before they are known right. Where
    // the configuration changed since, this ssh is given up and another
    // started with the options asked.
    if let Some(used) = guessed {
        if t.options.known() != used {
            let _ = ssh.child.kill();
            let _ = ssh.child.wait();
            let (argv, _) = t
                .argv_look(look, sum, walk)
                .map_err(|e| Failed::Other(e.0))?;
            ssh = spawn::spawn(&argv, spawn::Io::Pipes).map_err(|e| Failed::Other(e.0))?;
        }
    }
    let quiet = Quiet::start(
        ssh.child.id(),
        format!("{}: connection lost: no answer from ferry serve", t.host),
        t.timeout,
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
    let _ = stdin
        .write_all(&first_words(t, walk))
        .and_then(|()| stdin.flush());
    // The walked tree's directories, opened and listed behind its root in
    // the same flight when the listing here is done before the hello
    // comes (ssh holds the input until the session's command runs); not
    // when the start command names the tree to the ferry it runs, which
    // then answers the first flight unasked, its root's subdirectories
    // with it (protocol 18: `serve/push.rs`).
    let pushing = t.walk_word(walk).is_some();
    let early = walk
        .filter(|_| !pushing)
        .and_then(|_| super::take_hint())
        .and_then(|h| Some(Early::start(h, stdin.inner.try_clone().ok()?)));
    if let Err(n) = start.hello(&mut stdout) {
        // (Its input closed before ssh is waited for.)
        if let Some(e) = &early {
            e.settle();
        }
        drop(stdin);
        return Err(start.settle(n));
    }
    let read_hello = std::time::Instant::now();
    // What went in that flight (nothing more is written by it from now).
    let sent = early.map(|e| e.settle()).unwrap_or_default();
    let (tx, rx) = mpsc::sync_channel::<Out>(QUEUED);
    std::thread::spawn(move || proto::write_out(stdin, rx));
    // The round trip, measured by a request of its own sent now, once the
    // server has started: the first flight's answers come with the
    // server's first bytes where ssh forwards input before the command
    // runs, and one round trip after them where it waits for that
    // (OpenSSH: the session's window opens then), so they measure nothing.
    // The server answers with its own measure, from its hello's write to
    // this request's read (the reply may wait there behind the first
    // flight's listings: its time here would count their transfer). It
    // costs no wait: the walk starts without it and grows to the workers
    // it says ([`super::round_trip_known`]).
    let _ = tx.send(proto::frame(FIRST_PING, &Req::Ping).into());
    // Whether the server keeps owners and its cores, asked with the hello:
    // this first reply is read here, before the reader runs.
    let ((root, cores), pushed) = match start.info(&mut stdout) {
        Ok(info) => info,
        Err(n) => {
            drop(tx);
            return Err(start.settle(n));
        }
    };
    // What the server answers unasked: its root's subdirectories, opened
    // and listed as the first flight would have asked them.
    let sent = match pushed {
        Some(dirs) if walk.is_some() && sent.is_empty() => dirs
            .into_iter()
            .map(|(rel, handle, open_id, list_id)| EarlyDir {
                rel,
                handle,
                open_id,
                list_id,
            })
            .collect(),
        _ => sent,
    };
    // The first flight's replies go to their requests like any other.
    let mut pending = Pending::default();
    // (The first measure's reply is read by the reader thread itself; a
    // wait for the round trip waits for the second's.)
    let (ping2_tx, ping) = mpsc::sync_channel(1);
    pending.calls.insert(FIRST_PING2, ping2_tx);
    let first_dirs = walk.map(|path| {
        let dirs = sent
            .into_iter()
            .map(|d| {
                let (open_tx, opened) = mpsc::sync_channel(1);
                let (list_tx, listed) = mpsc::sync_channel(1);
                pending.calls.insert(d.open_id, open_tx);
                pending.calls.insert(d.list_id, list_tx);
                FirstDir {
                    rel: d.rel,
                    handle: d.handle,
                    asked: read_hello,
                    opened,
                    listed,
                }
            })
            .collect();
        (path.to_vec(), dirs)
    });
    let first = walk.map(|path| {
        let (stat_tx, stat) = mpsc::sync_channel(1);
        let (list_tx, list) = mpsc::sync_channel(1);
        pending.calls.insert(FIRST_STAT, stat_tx);
        pending.calls.insert(FIRST_LIST, list_tx);
        First {
            path: path.to_vec(),
            dir: FIRST_DIR,
            at: super::changes(),
            asked: read_hello,
            stat,
            list,
        }
    });
    let conn = Arc::new(Conn {
        host: t.host.clone(),
        tx,
        pending: Mutex::new(pending),
        next: AtomicU64::new(FIRST_FREE),
        gone: AtomicBool::new(false),
        root,
        cores,
        target: t.clone(),
        extra: Mutex::new(Vec::new()),
        closing: AtomicBool::new(false),
        unconfirmed: AtomicBool::new(false),
        closed: (Mutex::new(false), Condvar::new()),
        quiet: quiet.clone(),
        bufs: Mutex::new(Vec::new()),
        ping: Mutex::new(Some(ping)),
        ping_at: read_hello,
        ping2: Mutex::new(None),
        timed: AtomicBool::new(false),
        first: Mutex::new(first),
        closes: Mutex::new(Vec::new()),
        first_dirs: Mutex::new(first_dirs),
        roots: Mutex::new(Vec::new()),
    });
    quiet.attach(Arc::downgrade(&conn) as std::sync::Weak<dyn Session>);
    let c = conn.clone();
    let (child, tail) = (start.child, start.tail);
    let errt = start.errt.take().expect("not reaped");
    std::thread::spawn(move || read_replies(&c, stdout, child, tail, errt));
    Ok(conn)
}

/// The ids of the first flight's `StatRoot` and `List` of the tree a run
/// walks there, the handle it is opened as ([`first_words`]), the id of
/// the request that measures the round trip (`Conn::ping`), and the
/// directories opened in it at most ([`Early`]: each takes three numbers
/// after [`FIRST_PING`], its handle, its open's id, its listing's id).
pub(super) use crate::proto::{FIRST_DIR, FIRST_DIRS, FIRST_LIST, FIRST_PING, FIRST_STAT};
/// The first number a connection gives out.
const FIRST_FREE: u64 = FIRST_PING + 2 + 3 * FIRST_DIRS as u64;
/// The id of the round trip's second measure (`Conn::pinged`).
pub(super) const FIRST_PING2: u64 = FIRST_FREE - 1;

/// The walked tree's directories written into ssh's input while it
/// connects ([`super::hint_walk`]): a thread waits for the listing here
/// to be done and writes their opens and listings, unless the hello came
/// first ([`Early::settle`]).
struct Early(Arc<Mutex<EarlyState>>);

enum EarlyState {
    /// The listing here is not done yet; ssh's input to write to (a
    /// descriptor of its own, closed with this state: held no longer than
    /// the connection's start, so that closing the input ends it).
    Waiting(std::fs::File),
    /// Written: these.
    Sent(Vec<EarlyDir>),
    /// Too late (the hello came), or not written.
    Off,
}

/// A directory opened and listed in the first flight: its path below the
/// root, its handle and the ids of its open and listing.
struct EarlyDir {
    rel: Vec<u8>,
    handle: u64,
    open_id: u64,
    list_id: u64,
}

impl Early {
    fn start(hint: super::WalkHint, out: std::fs::File) -> Early {
        let state = Arc::new(Mutex::new(EarlyState::Waiting(out)));
        let s = state.clone();
        std::thread::spawn(move || {
            let dirs = hint();
            let mut st = s.lock();
            let EarlyState::Waiting(out) = &mut *st else {
                return;
            };
            let (frames, sent) = early_frames(&dirs);
            // (Held while written: the hello's reader waits for it, and the
            // writer thread starts only after.)
            let wrote = !sent.is_empty() && out.write_all(&frames).is_ok();
            *st = match wrote {
                true => EarlyState::Sent(sent),
                false => EarlyState::Off,
            };
        });
        Early(state)
    }

    /// What was written, and nothing more from now on.
    fn settle(&self) -> Vec<EarlyDir> {
        match std::mem::replace(&mut *self.0.lock(), EarlyState::Off) {
            EarlyState::Sent(v) => v,
            _ => Vec::new(),
        }
    }
}

/// The opens (`OpenDirAhead`, each chained to its parent's handle, the
/// root's [`FIRST_DIR`] at the top) and listings of `dirs` (parents first;
/// one whose parent is not among them is left out), [`FIRST_DIRS`] at most.
fn early_frames(dirs: &[Vec<u8>]) -> (Vec<u8>, Vec<EarlyDir>) {
    let mut frames = Vec::new();
    let mut sent: Vec<EarlyDir> = Vec::new();
    let mut handles: HashMap<&[u8], u64> = HashMap::new();
    let mut next = FIRST_PING + 1;
    for rel in dirs {
        if sent.len() >= FIRST_DIRS {
            break;
        }
        let Some((parent, name)) = super::chained(rel, FIRST_DIR, |p| handles.get(p).copied())
        else {
            continue;
        };
        if handles.contains_key(rel.as_slice()) {
            continue;
        }
        let (handle, open_id, list_id) = (next, next + 1, next + 2);
        next += 3;
        frames.extend(proto::frame(
            open_id,
            &Req::OpenDirAhead {
                dir: parent,
                name,
                new: handle,
            },
        ));
        frames.extend(proto::frame(list_id, &Req::List { dir: handle }));
        handles.insert(rel, handle);
        sent.push(EarlyDir {
            rel: rel.clone(),
            handle,
            open_id,
            list_id,
        });
    }
    (frames, sent)
}

/// What a connection writes first: the hello, this run's read-only flag,
/// the heartbeat request and the Info request (answered with the hello),
/// and the tree the run walks, `walk`: listed there ahead, while the
/// hellos and the first requests go back and forth, and stat'ed, opened
/// and listed for the walk ([`First`]). All of it in one write, before
/// ssh has connected: its answers come back in the round trip that
/// brings the first of the server's, not in rounds of their own after.
fn first_words(t: &Target, walk: Option<&[u8]>) -> Vec<u8> {
    let mut first = Vec::with_capacity(128);
    let _ = proto::write_hello(&mut first);
    if t.read_only {
        first.extend(proto::frame(0, &Req::ReadOnly));
    }
    // A heartbeat from the server while it works on a long request (a
    // signature of a huge file, a big removal), a few per timeout.
    let every = (t.timeout / 3).as_millis().max(1) as u64;
    first.extend(proto::frame(0, &Req::KeepAlive { ms: every }));
    first.extend(proto::frame(proto::INFO_ID, &Req::Info));
    if let Some(path) = walk {
        first.extend(proto::frame(0, &Req::ListAhead { path }));
        let dir = FIRST_DIR;
        first.extend(proto::frame(FIRST_STAT, &Req::StatRoot { path, dir }));
        first.extend(proto::frame(FIRST_LIST, &Req::List { dir }));
    }
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
                    Err(timed_out) => Failed::Other(timed_out.0),
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
        // The start command (self-install) prints START first: what the
        // remote shell printed before it is skipped, and said once a host.
        if t.install {
            match crate::install::skip_to_start(stdout) {
                Ok(noise) if noise.is_empty() => {}
                Ok(noise) => {
                    // Once per host and run, however many connections.
                    static NOTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
                    let mut noted = NOTED.lock();
                    if !noted.contains(&t.host) {
                        noted.push(t.host.clone());
                        eprintln!("{}", crate::install::noise_note(&t.host, &noise));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Err(NoHello::Kill(Failed::Other(format!("{}: {e}", t.host))))
                }
                Err(_) => return Err(NoHello::Ended),
            }
        }
        match proto::read_hello(stdout) {
            Ok(Hello::Ferry { protocol, .. }) if protocol == proto::PROTOCOL => Ok(()),
            Ok(Hello::Ferry { protocol, version }) => Err(NoHello::Kill(Failed::NoFerry(format!(
                "{}: the remote ferry ({}) is version {version} (protocol {protocol}), this is {} (protocol {}): install ferry {} there, or name one with --remote-ferry PATH",
                t.host, t.remote_ferry, proto::version(), proto::PROTOCOL, proto::version()
            )))),
            Ok(Hello::Other(b)) if b.starts_with(b"#") => {
                // The start command's report (or what else it said), up
                // to its last line: the caller then closes its input,
                // which ends what an `-e` wrapper runs beside ssh.
                let mut text = b;
                let end = format!("\n{}\n", crate::install::REPORT_END);
                let mut chunk = [0u8; 4096];
                while !text.windows(end.len()).any(|w| w == end.as_bytes()) {
                    match stdout.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => text.extend_from_slice(&chunk[..n]),
                    }
                }
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
    /// Read the answer to the first flight's `Info`, and before it the
    /// announcement of a server that answers the first flight unasked
    /// ([`Resp::Pushed`]: its root's subdirectories, name, handle and the
    /// ids of their open and listing).
    #[allow(clippy::type_complexity)]
    fn info(
        &self,
        stdout: &mut impl Read,
    ) -> Result<((bool, usize), Option<Vec<(Vec<u8>, u64, u64, u64)>>), NoHello> {
        let out_of_protocol = || {
            NoHello::Kill(Failed::Other(format!(
                "{}: ferry serve answered out of protocol",
                self.t.host
            )))
        };
        let mut pushed = None;
        loop {
            let Some((id, body)) = proto::read_frame(stdout).ok().flatten() else {
                return Err(NoHello::Ended);
            };
            match Body(body).get() {
                Ok(Resp::Info { root, cores }) if id == proto::INFO_ID => {
                    return Ok(((root, (cores as usize).max(1)), pushed))
                }
                Ok(Resp::Pushed(dirs)) if id == 0 && pushed.is_none() => {
                    // (Numbers the first flight reserves: nothing else.)
                    let fits = dirs.len() <= FIRST_DIRS
                        && dirs.iter().all(|&(_, h, o, l)| {
                            [h, o, l].iter().all(|&n| n > FIRST_PING && n < FIRST_PING2)
                        });
                    if !fits {
                        return Err(out_of_protocol());
                    }
                    pushed = Some(dirs)
                }
                _ => return Err(out_of_protocol()),
            }
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
        let spare = || conn.bufs.lock().pop();
        match proto::read_placed(&mut r, spare) {
            Ok(Some((id, body))) => {
                if id == FIRST_PING {
                    conn.pinged(&body);
                } else if id == FIRST_PING2 {
                    conn.pinged2();
                }
                let mut p = conn.pending.lock();
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
        *lock.lock() = true;
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
