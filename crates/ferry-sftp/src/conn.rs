//! One SFTP session: the system `ssh` (or the `-e` command) running the
//! `sftp` subsystem, a writer thread feeding its stdin (requests queued by
//! any thread are written in batches) and a reader thread handing each
//! reply to the request of its id. Any number of threads call at once;
//! each blocks only on its own reply, so requests of all the engine's
//! workers are in flight together.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use ferry_ssh::extra::{self, Extra};
use ferry_ssh::quiet::{Quiet, Reading, Session, Writing};
use ferry_ssh::spawn::{self, is_ssh_failure, Tail};
use ferry_ssh::{Lost, SessionError, Target};

use crate::wire::{self, Rd, Reply, Req};

mod feed;

pub use feed::Batch;
pub(crate) use feed::{Feed, Out};

/// Bytes per read or write request at most: OpenSSH's limit is 255 KiB; a
/// whole number of 4 KiB blocks keeps ranged downloads block-aligned.
const CHUNK_MAX: u32 = 252 << 10;

/// Where a reply goes.
enum Slot {
    /// To the thread waiting on the receiver ([`Conn::start`]).
    Chan(SyncSender<io::Result<Reply>>),
    /// To a commit moved on by the reader thread itself
    /// ([`crate::pipe`]): no thread wakes for it.
    Flight(Arc<crate::pipe::Shared>),
}

#[derive(Default)]
struct Pending {
    calls: HashMap<u32, Slot>,
    /// Why the session is gone, once it is.
    dead: Option<String>,
}

/// What the server offers beyond SFTP version 3.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extensions {
    /// `posix-rename@openssh.com`: rename replacing the target atomically.
    pub posix_rename: bool,
    /// `fsync@openssh.com`.
    pub fsync: bool,
    /// `lsetstat@openssh.com`: set a symlink's own times.
    pub lsetstat: bool,
    /// `hardlink@openssh.com`: another name of a file.
    pub hardlink: bool,
    /// `statvfs@openssh.com`: a filesystem's free space (to tell a full
    /// disk from the other causes of `SSH_FX_FAILURE`).
    pub statvfs: bool,
    /// `home-directory`: a user's home (for `~user`).
    pub home_directory: bool,
    /// `expand-path@openssh.com`: `~user` expanded (and resolved).
    pub expand_path: bool,
}

/// A live session.
pub struct Conn {
    /// `[user@]host`, for messages.
    pub host: String,
    /// To ssh's stdin ([`Feed`]). Not bounded: every sender bounds what
    /// it keeps in flight (a file's writes ahead, a thread's commits), and
    /// the reader thread, which sends a commit's next requests, must
    /// never block (it would stop reading the replies that free room).
    tx: Arc<Feed>,
    pending: Mutex<Pending>,
    next: AtomicU32,
    gone: AtomicBool,
    /// What the server offers.
    pub ext: Extensions,
    /// Bytes per read or write request.
    pub chunk: u32,
    target: Target,
    /// Further sessions to the same host for big files, opened when first
    /// needed.
    extra: Extra<Conn>,
    /// The session of the next small file ([`Conn::next_small`]), and the
    /// further sessions whose opening was started for them.
    turn: AtomicUsize,
    opening: Mutex<Vec<usize>>,
    /// The I/O timeout's watch (`--timeout`).
    quiet: Arc<Quiet>,
}

impl Session for Conn {
    fn waiting(&self) -> bool {
        !self.pending.lock().calls.is_empty()
    }

    fn give_up(&self, why: String) {
        self.die(why);
    }
}

fn lost_error(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, Lost(why))
}

impl Conn {
    fn lost(&self) -> io::Error {
        let why = self.pending.lock().dead.clone();
        lost_error(why.unwrap_or_else(|| format!("{}: SFTP session lost", self.host)))
    }

    /// `Err` once the session is gone.
    pub fn alive(&self) -> io::Result<()> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(self.lost());
        }
        Ok(())
    }

    /// `req` given an id whose reply comes on the receiver: the packet
    /// to send.
    fn register(&self, req: Req) -> io::Result<(Vec<u8>, Receiver<io::Result<Reply>>)> {
        let (stx, srx) = mpsc::sync_channel(1);
        Ok((self.register_as(req, Slot::Chan(stx))?, srx))
    }

    fn register_as(&self, req: Req, slot: Slot) -> io::Result<Vec<u8>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut p = self.pending.lock();
        if let Some(why) = &p.dead {
            return Err(lost_error(why.clone()));
        }
        if p.calls.is_empty() {
            // Waiting starts now (the I/O timeout counts from here).
            self.quiet.touch();
        }
        p.calls.insert(id, slot);
        Ok(req.finish(id))
    }

    /// Start `req` for commit `f` as part of `batch`: its reply goes to
    /// [`crate::pipe::on_reply`] in the reader thread.
    pub(crate) fn start_flight_in(
        self: &Arc<Conn>,
        batch: &mut Batch,
        req: Req,
        f: &Arc<crate::pipe::Shared>,
    ) -> io::Result<()> {
        let packet = self.register_as(req, Slot::Flight(f.clone()))?;
        batch.push(self, packet);
        Ok(())
    }

    /// Send a request; its reply comes on the receiver.
    pub fn start(&self, req: Req) -> io::Result<Receiver<io::Result<Reply>>> {
        let (packet, srx) = self.register(req)?;
        if let Err(p) = self.tx.send(packet) {
            let id = u32::from_be_bytes(p[5..9].try_into().expect("4 bytes"));
            self.pending.lock().calls.remove(&id);
            return Err(self.lost());
        }
        Ok(srx)
    }

    /// Start `req` as part of `batch`: sent with the batch's other
    /// requests to this session, in one write, when it is flushed.
    pub fn start_in(
        self: &Arc<Conn>,
        batch: &mut Batch,
        req: Req,
    ) -> io::Result<Receiver<io::Result<Reply>>> {
        let (packet, srx) = self.register(req)?;
        batch.push(self, packet);
        Ok(srx)
    }

    /// Send a request whose reply nobody waits for (closing a handle).
    pub fn send(&self, req: Req) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(req.finish(id));
    }

    /// Wait for a reply started with [`Conn::start`].
    pub fn wait(&self, rx: &Receiver<io::Result<Reply>>) -> io::Result<Reply> {
        rx.recv().unwrap_or_else(|_| Err(self.lost()))
    }

    /// The reply of a request started with [`Conn::start`] if it is
    /// there, without waiting.
    pub fn poll(&self, rx: &Receiver<io::Result<Reply>>) -> Option<io::Result<Reply>> {
        match rx.try_recv() {
            Ok(r) => Some(r),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(self.lost())),
        }
    }

    /// A path the user typed, as the server takes it: a leading `~` is
    /// the login directory (the home: `~`, `~/rest` are `.`, `rest`, as
    /// OpenSSH's sftp-server expands them), `~user` that user's home (asked
    /// with `home-directory`, else `expand-path@openssh.com`). Any other
    /// path is as typed.
    pub fn expand<'a>(&self, p: &'a [u8]) -> io::Result<std::borrow::Cow<'a, [u8]>> {
        use std::borrow::Cow;
        if p.first() != Some(&b'~') {
            return Ok(Cow::Borrowed(p));
        }
        let end = p.iter().position(|b| *b == b'/').unwrap_or(p.len());
        let user = &p[1..end];
        if user.is_empty() {
            let rest = &p[end..];
            let rest = &rest[rest.iter().take_while(|b| **b == b'/').count()..];
            return Ok(Cow::Borrowed(rest));
        }
        let name = String::from_utf8_lossy(user);
        let reply = if self.ext.home_directory {
            self.call(Req::ext("home-directory").str(user))
        } else if self.ext.expand_path {
            self.call(Req::ext("expand-path@openssh.com").str(&p[..end]))
        } else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("~{name}: this SFTP server cannot name another user's home (no home-directory or expand-path@openssh.com): give the path"),
            ));
        };
        let home = reply.and_then(|r| r.name()).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound
                || crate::wire::status_code(&e) == Some(crate::wire::FX_FAILURE)
            {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("~{name}: no such user there"),
                )
            } else {
                e
            }
        })?;
        let mut out = home;
        out.extend_from_slice(&p[end..]);
        Ok(Cow::Owned(out))
    }

    /// Send a request and wait for its reply.
    pub fn call(&self, req: Req) -> io::Result<Reply> {
        let rx = self.start(req)?;
        self.wait(&rx)
    }

    /// How many sessions pulled files are spread over: `--connections`,
    /// else 4 (the server runs one single-threaded `sftp-server` per
    /// session, and a small file read costs it a few requests).
    pub fn width(&self) -> usize {
        self.target.connections.map_or(4, |n| usize::from(n).max(1))
    }

    /// How many sessions a big file's ranges go over: `--connections`,
    /// else 2. With 64 writes or 32 reads in flight a session keeps its
    /// `sftp-server` busy; each further one adds an ssh, an sshd and a
    /// server process to share the cores: a 1 GiB file over loopback on
    /// 2 cores took 4.8 s pushed and 4.7 s pulled over 4 sessions, 4.05 s
    /// and 3.5 s over 2, 4.3 s and 3.7 s over 1 (bench/LOG.md).
    pub fn big_width(&self) -> usize {
        self.target.connections.map_or(2, |n| usize::from(n).max(1))
    }

    /// How many sessions small files pushed go over: `--connections`,
    /// else 2. A small file written costs the server far more than its
    /// bytes cost ssh (five requests, a create and a rename): two
    /// single-threaded `sftp-server`s keep two cores busy, and each further
    /// session costs its key exchange (the client's post-quantum key
    /// generation: about 0.1 s of CPU) and gathers fewer requests per
    /// packet, for no gain (measured on 2 cores, bench/LOG.md).
    pub fn small_width(&self) -> usize {
        self.target.connections.map_or(2, |n| usize::from(n).max(1))
    }

    /// Session `k` (0 is this one) of [`Conn::width`], opened now if it is
    /// not yet; this one when another cannot be opened.
    pub fn nth(self: &Arc<Conn>, k: usize) -> Arc<Conn> {
        extra::nth(self, &self.extra, k, gone, || open(&self.target).ok())
    }

    /// The session for the next file of a run's many: turn by turn over
    /// `width` sessions ([`Conn::width`] for reads, [`Conn::small_width`]
    /// for writes) (each server process is single-threaded
    /// and each ssh encrypts on one core: files spread over several keep
    /// more of them in flight). A further session is opened in the
    /// background when first wanted; until it is there (or if it cannot
    /// be opened) this one serves. A file's requests all go over the one
    /// session returned.
    pub fn next_small(self: &Arc<Conn>, width: usize) -> Arc<Conn> {
        let k = self.turn.fetch_add(1, Ordering::Relaxed) % width.max(1);
        if k == 0 {
            return self.clone();
        }
        if let Some(c) = extra::live(&self.extra, k, gone) {
            return c;
        }
        let mut opening = self.opening.lock();
        if !opening.contains(&k) {
            opening.push(k);
            let me = Arc::downgrade(self);
            let t = self.target.clone();
            std::thread::spawn(move || {
                let Ok(c) = open(&t) else { return };
                let Some(me) = me.upgrade() else { return };
                // (One `nth` opened meanwhile is kept.)
                extra::place(&me.extra, k, c, gone);
            });
        }
        self.clone()
    }

    fn die(&self, why: String) {
        let calls = {
            let mut p = self.pending.lock();
            p.dead.get_or_insert(why.clone());
            std::mem::take(&mut p.calls)
        };
        self.gone.store(true, Ordering::Relaxed);
        self.tx.close();
        let mut out = Out::new(self);
        for (_, slot) in calls {
            let e = Err(lost_error(why.clone()));
            match slot {
                Slot::Chan(s) => {
                    let _ = s.send(e);
                }
                Slot::Flight(f) => crate::pipe::on_reply(&f, e, &mut out),
            }
        }
    }
}

/// Whether `b` starts with a whole packet (read without blocking).
fn whole_packet(b: &[u8]) -> bool {
    b.len() >= 4 && b.len() - 4 >= u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}

/// This run's sessions, one per target.
static CONNS: Mutex<Vec<(Target, Arc<Conn>)>> = Mutex::new(Vec::new());

/// The session to `t`, made once per run and shared.
pub fn connect(t: &Target) -> Result<Arc<Conn>, SessionError> {
    let mut conns = CONNS.lock();
    if let Some((_, c)) = conns.iter().find(|(k, _)| k == t) {
        return Ok(c.clone());
    }
    let c = open(t)?;
    conns.push((t.clone(), c.clone()));
    Ok(c)
}

/// A new session in place of `dead`, this run's session to `t` that was
/// lost, shared from now on (one another store made again already is
/// taken as it is).
pub fn reconnect(t: &Target, dead: &Arc<Conn>) -> Result<Arc<Conn>, SessionError> {
    let mut conns = CONNS.lock();
    if let Some(i) = conns.iter().position(|(k, _)| k == t) {
        let c = &conns[i].1;
        if !Arc::ptr_eq(c, dead) && !c.gone.load(Ordering::Relaxed) {
            return Ok(c.clone());
        }
        let (_, old) = conns.swap_remove(i);
        old.extra.lock().clear();
    }
    let c = open(t)?;
    conns.push((t.clone(), c.clone()));
    Ok(c)
}

/// One line for a session that ended before the server answered.
fn failed(
    t: &Target,
    child: &mut Child,
    errt: JoinHandle<()>,
    tail: &Tail,
    quiet: &Quiet,
) -> String {
    let (why, tail) = match spawn::ended(t, child, errt, tail, quiet) {
        Ok(w) => w,
        Err(timed_out) => return timed_out.0,
    };
    if is_ssh_failure(&why) {
        return why;
    }
    let last = tail.iter().rev().find(|l| !l.trim().is_empty());
    format!(
        "{}: the SFTP server did not start (ssh -s {} sftp{})",
        t.host,
        t.host,
        last.map(|l| format!(": {}", l.trim())).unwrap_or_default()
    )
}

/// A session that is gone (lost, or closed).
fn gone(c: &Conn) -> bool {
    c.gone.load(Ordering::Relaxed)
}

fn read_packet(r: &mut impl Read) -> io::Result<Option<Reply>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if !(1..=(1 << 20)).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SFTP: a packet of {len} bytes"),
        ));
    }
    let mut body = Vec::with_capacity(len);
    r.take(len as u64).read_to_end(&mut body)?;
    if body.len() < len {
        return Ok(None);
    }
    // Type and id stay in front of the fields: moving the rest would copy
    // every read's data once more.
    Ok(Some(Reply { t: body[0], body }))
}

fn open(t: &Target) -> Result<Arc<Conn>, String> {
    let argv = t.subsystem("sftp");
    // ssh's stdin and stdout: one socket pair, as OpenSSH's own scp and
    // sftp give it. Fed through pipes, ssh kept a standing backlog it
    // moved in memory again and again: ~1 CPU-s per GiB pushed
    // (BENCHMARKS.md, "where a 1-session SFTP push loses to plain scp").
    let io = match std::env::var_os("FERRY_SFTP_PIPES") {
        None => spawn::Io::SocketPair,
        Some(_) => spawn::Io::Pipes,
    };
    let ssh = spawn::spawn(&argv, io)?;
    let mut child = ssh.child;
    let quiet = Quiet::start(
        child.id(),
        format!(
            "{}: SFTP session lost: no answer from the SFTP server",
            t.host
        ),
        t.timeout,
    );
    let (tail, errt) = (ssh.tail, ssh.errt);
    let mut stdin = Writing {
        inner: ssh.stdin,
        quiet: quiet.clone(),
    };
    let mut stdout = Reading {
        inner: ssh.stdout,
        quiet: quiet.clone(),
    };
    // INIT, version 3; the VERSION reply lists the extensions.
    let _ = stdin.write_all(&[0, 0, 0, 5, wire::INIT, 0, 0, 0, 3]);
    let (ext, limits) = match read_packet(&mut stdout) {
        Ok(Some(r)) if r.t == wire::VERSION => extensions(&r),
        Ok(Some(r)) => {
            spawn::kill(&mut child, &quiet);
            return Err(format!(
                "{}: the SFTP server answered out of protocol (type {})",
                t.host, r.t
            ));
        }
        _ => {
            drop(stdin);
            return Err(failed(t, &mut child, errt, &tail, &quiet));
        }
    };
    let tx = Feed::start(stdin);
    let mut conn = Conn {
        host: t.host.clone(),
        tx,
        pending: Mutex::new(Pending::default()),
        next: AtomicU32::new(1),
        gone: AtomicBool::new(false),
        ext,
        // Without limits@openssh.com: what every server takes.
        chunk: 32 << 10,
        target: t.clone(),
        extra: Mutex::new(Vec::new()),
        turn: AtomicUsize::new(0),
        opening: Mutex::new(Vec::new()),
        quiet: quiet.clone(),
    };
    if limits {
        match conn.limits(&mut stdout) {
            Ok(Some(chunk)) => conn.chunk = chunk.max(conn.chunk),
            Ok(None) => {}
            Err(Some(e)) => {
                spawn::kill(&mut child, &quiet);
                return Err(format!("{}: {e}", t.host));
            }
            Err(None) => {
                drop(conn);
                return Err(failed(t, &mut child, errt, &tail, &quiet));
            }
        }
    }
    let conn = Arc::new(conn);
    quiet.attach(Arc::downgrade(&conn) as std::sync::Weak<dyn Session>);
    let c = conn.clone();
    std::thread::spawn(move || read_replies(&c, stdout, child, tail, errt));
    if !limits {
        // The round trip, from a request every server answers.
        let asked = std::time::Instant::now();
        if conn.call(Req::path(wire::STAT, b".")).is_ok() {
            ferry_ssh::note_round_trip(asked.elapsed());
        }
    }
    Ok(conn)
}

/// The extensions a VERSION reply lists, and whether `limits@openssh.com`
/// is among them.
fn extensions(version: &Reply) -> (Extensions, bool) {
    let mut ext = Extensions::default();
    let mut limits = false;
    // After the type: the version, then the extensions.
    let mut r = Rd(&version.body[1..]);
    let _ = r.u32();
    while let (Ok(name), Ok(_)) = (r.str(), r.str()) {
        match name {
            b"posix-rename@openssh.com" => ext.posix_rename = true,
            b"fsync@openssh.com" => ext.fsync = true,
            b"lsetstat@openssh.com" => ext.lsetstat = true,
            b"hardlink@openssh.com" => ext.hardlink = true,
            b"statvfs@openssh.com" => ext.statvfs = true,
            b"home-directory" => ext.home_directory = true,
            b"expand-path@openssh.com" => ext.expand_path = true,
            b"limits@openssh.com" => limits = true,
            _ => {}
        }
    }
    (ext, limits)
}

impl Conn {
    /// `limits@openssh.com`, asked before the reader runs (this first reply
    /// is read here): the bytes per read or write the server takes (`None`:
    /// it did not say). It is also the session's round trip (what the
    /// engine's number of workers follows, as over ferry's own protocol).
    /// `Err(None)`: the session ended.
    fn limits(&self, stdout: &mut impl Read) -> Result<Option<u32>, Option<io::Error>> {
        let asked = std::time::Instant::now();
        let _ = self.tx.send(Req::ext("limits@openssh.com").finish(0));
        let reply = read_packet(stdout);
        ferry_ssh::note_round_trip(asked.elapsed());
        let Ok(Some(r)) = reply else {
            return Err(None);
        };
        let mut rd = r.extended().map_err(Some)?;
        let fields = (rd.u64(), rd.u64(), rd.u64());
        Ok(match fields {
            (Ok(_packet), Ok(read), Ok(write)) => {
                let fit = read.min(write).min(u64::from(CHUNK_MAX)) as u32;
                Some(fit & !4095)
            }
            _ => None,
        })
    }
}

fn read_replies(
    conn: &Conn,
    stdout: Reading<std::fs::File>,
    mut child: Child,
    tail: Tail,
    errt: JoinHandle<()>,
) {
    // Smaller than a read's reply: the most of its data goes from the
    // pipe straight into the reply's buffer (a bigger buffer copies it
    // once more, on a pull about 0.1 s of CPU per GiB).
    let mut r = BufReader::with_capacity(64 << 10, stdout);
    let mut out = Out::new(conn);
    let end = loop {
        // The requests the replies taken so far made go before this
        // thread may block on a read.
        if !whole_packet(r.buffer()) {
            out.flush();
        }
        match read_packet(&mut r) {
            Ok(Some(reply)) => {
                let Some(id) = reply.body.get(1..5) else {
                    break Some(io::Error::new(io::ErrorKind::InvalidData, "SFTP: no id"));
                };
                let id = u32::from_be_bytes(id.try_into().expect("4 bytes"));
                let slot = conn.pending.lock().calls.remove(&id);
                match slot {
                    Some(Slot::Chan(s)) => {
                        let _ = s.send(Ok(reply));
                    }
                    Some(Slot::Flight(f)) => crate::pipe::on_reply(&f, Ok(reply), &mut out),
                    None => {}
                }
            }
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    out.flush();
    drop(out);
    let status = spawn::reap(&mut child, errt, &conn.quiet, true);
    let why = spawn::lost(
        &conn.host,
        "SFTP session lost",
        end,
        &tail,
        status,
        &conn.quiet,
    );
    conn.die(why);
}
