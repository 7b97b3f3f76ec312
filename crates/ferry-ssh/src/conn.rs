//! One connection to a `ferry serve`: the system `ssh` (or the `-e`
//! command) as a child process, a writer thread feeding its stdin and a
//! reader thread taking replies from its stdout and handing each to the
//! request of its id. Any number of threads call at once; each blocks only
//! on its own reply.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;

use crate::spawn::NO_FERRY;
pub use crate::spawn::{classify, is_ssh_failure};
use crate::SessionError;
pub use target::{split_words, Options};

mod open;
mod target;

use open::{open, open_look, Failed};

use crate::install::{Look, Report};
use crate::proto::{self, Out, Req, Resp};
use crate::quiet::{Quiet, Session};

/// Frames queued for the writer thread at most (a big file's chunks wait
/// for room: memory stays bounded).
const QUEUED: usize = 64;
/// Directory closes held at most before they are sent ([`Conn::close_dir`]).
const CLOSES: usize = 64;
/// The bytes of one `Close` frame, about (a handle of up to 2^28).
const CLOSE_FRAME: usize = 17;
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
    /// built-in cipher order (`target::cipher_options`).
    pub options: Options,
    /// `--connections` (unset: from the cores of both ends).
    pub connections: Option<u16>,
    /// A server that sends and takes no byte for this long while requests
    /// wait for it is given up (`--timeout`).
    pub timeout: std::time::Duration,
    /// This process only reads: the `ferry serve` there acts on no
    /// rollback record (`ferry ls`, `ferry versions`, a dry run).
    pub read_only: bool,
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
    /// `--timeout` (unset: [`crate::quiet::DEFAULT_TIMEOUT`]).
    pub timeout: Option<std::time::Duration>,
    /// This process only reads (`ferry ls`, `ferry versions`, a dry run):
    /// every `ferry serve` it starts acts on no rollback record.
    pub read_only: bool,
}

/// Connections per host at most when `--connections` is not given.
const DEFAULT_CONNECTIONS: usize = 4;

/// The error of a request whose connection is gone: the engine's
/// [`Unavailable`](ferry_engine::class::Unavailable) (one class for every
/// backend), which a run reports once, not one line per entry.
pub use ferry_engine::class::Unavailable as Lost;

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
    /// Set once a request without a reply whose outcome no later reply
    /// confirms was sent ([`unconfirmed`]: an `Abort`, ...): the run waits
    /// for the session's end ([`close_all`]), by which the server has
    /// carried it out. Every other change was confirmed by a reply that
    /// comes once it is done.
    unconfirmed: AtomicBool,
    /// Set (and notified) once ssh has exited and been waited for.
    closed: (Mutex<bool>, Condvar),
    /// The I/O timeout's watch (`--timeout`).
    quiet: Arc<Quiet>,
    /// Buffers of big replies given back ([`Conn::recycle`]).
    bufs: Mutex<Vec<Vec<u8>>>,
    /// The reply slot of the round trip's second measure (the first is
    /// sent when the hello was read, `ping_at`; [`Conn::pinged`]), until
    /// waited for.
    ping: Mutex<Option<Receiver<io::Result<Vec<u8>>>>>,
    ping_at: std::time::Instant,
    /// The second measure's start and the first's value ([`Conn::pinged`]).
    ping2: Mutex<Option<(std::time::Instant, u64)>>,
    /// Set once its reply came (and the round trip was counted).
    timed: AtomicBool,
    /// The walked tree asked about in the first flight ([`First`]), until
    /// its store takes it.
    first: Mutex<Option<First>>,
    /// Directories' `Close` frames not sent yet ([`Conn::close_dir`]).
    closes: Mutex<Vec<u8>>,
    /// The walked tree's directories opened and listed in the first
    /// flight ([`hint_walk`]), until the walk's hint takes them.
    /// (The walked tree's path.)
    first_dirs: Mutex<Option<(Vec<u8>, Vec<FirstDir>)>>,
    /// Trees opened while a location was resolved ([`Req::StatRoot`]):
    /// their path, handle and metadata, until a store rooted there opens
    /// its root ([`Conn::take_root`]) without asking again.
    roots: Mutex<Vec<OpenedRoot>>,
}

/// A tree opened while a location was resolved: its path, handle and
/// metadata, and its listing when that was asked with it.
type OpenedRoot = (Vec<u8>, u64, ferry_engine::Meta, Option<Asked>);

/// The tree a run walks there, asked about in the connection's first
/// write (`open::first_words`): its `StatRoot` (opened as handle `dir`)
/// and its listing, answered with the hello's round trip, not one more
/// after it. `at` and `asked`: as [`Asked`]'s, from when the hello was
/// read (the server lists it after that).
pub(crate) struct First {
    pub(crate) path: Vec<u8>,
    pub(crate) dir: u64,
    pub(crate) at: u64,
    pub(crate) asked: std::time::Instant,
    pub(crate) stat: Receiver<io::Result<Vec<u8>>>,
    pub(crate) list: Receiver<io::Result<Vec<u8>>>,
}

/// A directory of the walked tree opened (`OpenDirAhead`, chained to its
/// parent's handle from the root's, [`First::dir`]) and listed in the
/// connection's first flight ([`hint_walk`]): `rel` below the root.
pub(crate) struct FirstDir {
    pub(crate) rel: Vec<u8>,
    pub(crate) handle: u64,
    pub(crate) asked: std::time::Instant,
    pub(crate) opened: Receiver<io::Result<Vec<u8>>>,
    pub(crate) listed: Receiver<io::Result<Vec<u8>>>,
}

/// Where directory `rel` (below a tree opened as `root`) is opened ahead
/// from: its parent's handle (`root`'s at the top; `handle_of` the
/// parents opened ahead before it) and its name; `None` when its parent
/// was not (it is left to the walk) or it has no name. The one rule of a
/// hint's chained `OpenDirAhead`s, in the first flight and after.
pub(crate) fn chained(
    rel: &[u8],
    root: u64,
    handle_of: impl Fn(&[u8]) -> Option<u64>,
) -> Option<(u64, &[u8])> {
    let (parent, name) = match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (handle_of(&rel[..i])?, &rel[i + 1..]),
        None => (root, rel),
    };
    (!name.is_empty()).then_some((parent, name))
}

/// The directories the other side's tree has (paths relative to its root,
/// parents first, those the walk leaves out left out), once its listing
/// made ahead is done: waited for on a thread of its own.
pub type WalkHint = Box<dyn FnOnce() -> Vec<Vec<u8>> + Send>;

/// The hint for the next connection made for a run's walk ([`hint_walk`]).
static HINT: Mutex<Option<WalkHint>> = Mutex::new(None);

/// Before a run connects: the directories of the tree it walks there, as
/// the tree listed here names them. The connection made for that walk
/// sends their opens and listings in its first flight, behind the root's
/// (written into ssh's input while it connects, when the listing here is
/// done by then): the tree's first levels come back with the hello, not a
/// round trip after it. What it opened is taken by the walk's own hint
/// (`PipelineStore::expect_dirs`) under the same rules (the identity the
/// parent's listing names, at most 3 s old).
pub fn hint_walk(h: WalkHint) {
    *HINT.lock() = Some(h);
}

/// The hint for a connection made for a walk, taken once.
pub(crate) fn take_hint() -> Option<WalkHint> {
    HINT.lock().take()
}

/// A reply asked for ahead of its use: [`changes`] and the time when it
/// was asked, and the reply.
pub(crate) type Asked = (u64, std::time::Instant, Receiver<io::Result<Vec<u8>>>);

/// A listing asked ahead of its use is used at most this long after.
pub(crate) const FRESH: std::time::Duration = std::time::Duration::from_secs(3);

/// Requests that may change a file or directory sent so far, on every
/// connection of this process ([`Req::changes_nothing`]): a listing asked
/// ahead of its use is used only when none was sent since it was asked.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// [`CHANGES`] now.
pub(crate) fn changes() -> u64 {
    CHANGES.load(Ordering::Relaxed)
}

fn note(req: &Req<'_>) {
    if !req.changes_nothing() {
        CHANGES.fetch_add(1, Ordering::Relaxed);
    }
}

impl Session for Conn {
    fn waiting(&self) -> bool {
        !self.pending.lock().calls.is_empty()
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

/// A request sent without a reply ([`Conn::send`]) whose outcome no later
/// reply confirms: one that changes something ([`Req::changes_nothing`]
/// says which do not: a handle's `Close`, `ListAhead`, `Diff`, ...) and is
/// not a file's data (`Create`, `Write`, `WriteAt`, `SetLen`, the delta's
/// ops, `PartAttach`), which the server carries out in order before its
/// `Commit`, `PatchCommit` or `PartSync`, whose reply says how it went (a
/// writer that gets none is discarded: an `Abort`). So: a writer's discard
/// (`Abort`, `PatchAbort`), a partial's record (best effort), and any kind
/// added later that changes something.
pub(crate) fn unconfirmed(req: &Req<'_>) -> bool {
    !req.changes_nothing()
        && !matches!(
            req,
            Req::Create { .. }
                | Req::Write { .. }
                | Req::WriteAt { .. }
                | Req::SetLen { .. }
                | Req::PatchFrom { .. }
                | Req::Patch { .. }
                | Req::PatchBegin { .. }
                | Req::PatchWrite { .. }
                | Req::PartAttach { .. }
        )
}

impl Conn {
    fn lost(&self) -> io::Error {
        let why = self.pending.lock().dead.clone();
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
        note(req);
        if unconfirmed(req) {
            self.unconfirmed.store(true, Ordering::Relaxed);
        }
        self.tx
            .send(self.framed(0, req).into())
            .map_err(|_| self.lost())
    }

    /// Close directory handle `dir` there: its `Close` goes with the next
    /// request, or with the directories closed meanwhile once there are
    /// [`CLOSES`] (a walk closes each directory it is done with: one
    /// write, one ssh packet and a wake-up at both ends each, else). The
    /// server's descriptors stay open that much longer; a session's end
    /// closes them all.
    pub(crate) fn close_dir(&self, dir: u64) {
        let mut c = self.closes.lock();
        c.extend(proto::frame(0, &Req::Close { handle: dir }));
        if c.len() >= CLOSES * CLOSE_FRAME {
            let out = std::mem::take(&mut *c);
            drop(c);
            let _ = self.tx.send(out.into());
        }
    }

    /// Request `req` as frame `id`, behind the closes not sent yet.
    fn framed(&self, id: u64, req: &Req<'_>) -> Vec<u8> {
        let f = proto::frame(id, req);
        let mut c = self.closes.lock();
        if c.is_empty() {
            return f;
        }
        let mut out = std::mem::take(&mut *c);
        out.extend_from_slice(&f);
        out
    }

    /// Send a frame built by the caller (a [`Out::Piped`] one) that gets
    /// no reply.
    pub fn send_out(&self, out: Out) -> io::Result<()> {
        // (A file's bytes: a change.)
        CHANGES.fetch_add(1, Ordering::Relaxed);
        self.tx.send(out).map_err(|_| self.lost())
    }

    /// Send a request; its reply comes on the receiver.
    pub fn start(&self, req: &Req<'_>) -> io::Result<Receiver<io::Result<Vec<u8>>>> {
        note(req);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (stx, srx) = mpsc::sync_channel(1);
        {
            let mut p = self.pending.lock();
            if let Some(why) = &p.dead {
                return Err(lost_error(why.clone()));
            }
            if p.calls.is_empty() {
                // Waiting starts now (the I/O timeout counts from here).
                self.quiet.touch();
            }
            p.calls.insert(id, stx);
        }
        if self.tx.send(self.framed(id, req).into()).is_err() {
            self.pending.lock().calls.remove(&id);
            return Err(self.lost());
        }
        Ok(srx)
    }

    /// Send a request answered by any number of replies, each handed to
    /// the receiver as it comes, until the connection ends (then an error).
    pub fn stream(&self, req: &Req<'_>) -> io::Result<mpsc::Receiver<io::Result<Vec<u8>>>> {
        note(req);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (stx, srx) = mpsc::channel();
        {
            let mut p = self.pending.lock();
            if let Some(why) = &p.dead {
                return Err(lost_error(why.clone()));
            }
            p.streams.insert(id, stx);
        }
        if self.tx.send(self.framed(id, req).into()).is_err() {
            self.pending.lock().streams.remove(&id);
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
        let rx = self.start(req)?;
        self.wait(&rx)
    }

    /// The directories opened in the first flight below the tree at `path`
    /// opened as `dir` ([`FirstDir`]); taken once.
    pub(crate) fn take_first_dirs(&self, path: &[u8], dir: u64) -> Vec<FirstDir> {
        let mut first = self.first_dirs.lock();
        match first.as_ref() {
            Some((p, _)) if p == path && dir == open::FIRST_DIR => {
                first.take().map(|(_, d)| d).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }

    /// The first flight's `StatRoot` and listing of the tree at `path`
    /// ([`First`]), when they were asked; taken once.
    pub(crate) fn take_first(&self, path: &[u8]) -> Option<First> {
        let mut first = self.first.lock();
        if first.as_ref()?.path != path {
            return None;
        }
        first.take()
    }

    /// The reply to the round trip's first measure came (the reader
    /// thread, as it reads it): the server's measure, from its hello's
    /// write to the ping's read. Where the first flight's answers stream
    /// out meanwhile (its listings, on a link whose ends share the CPU),
    /// that ping may have waited on its way there far longer than the
    /// link's round trip (10-14 ms for 0.5 on a 2-core loopback): a second
    /// one goes now, when that stream is mostly out, timed here, and the
    /// lesser of the two is the round trip.
    pub(crate) fn pinged(&self, reply: &[u8]) {
        let rtt1 = match proto::decode::<Resp>(reply) {
            Ok(Resp::Count(us)) => us,
            _ => self.ping_at.elapsed().as_micros() as u64,
        };
        *self.ping2.lock() = Some((std::time::Instant::now(), rtt1));
        let second = proto::frame(open::FIRST_PING2, &Req::Ping);
        if self.tx.try_send(second.into()).is_err() {
            // (No room: the first measure is the one.)
            self.pinged2();
            if let Some(s) = self.pending.lock().calls.remove(&open::FIRST_PING2) {
                let _ = s.send(Ok(Vec::new()));
            }
        }
    }

    /// The reply to the second measure came ([`Conn::pinged`]).
    pub(crate) fn pinged2(&self) {
        let Some((at, rtt1)) = self.ping2.lock().take() else {
            return;
        };
        let rtt = rtt1.min(at.elapsed().as_micros() as u64);
        RTT_US.fetch_max(rtt.max(1), Ordering::Relaxed);
        self.timed.store(true, Ordering::Release);
    }

    /// Whether this connection's round trip is known (or never will be:
    /// the connection is gone).
    fn settled(&self) -> bool {
        self.timed.load(Ordering::Acquire) || self.gone.load(Ordering::Relaxed)
    }

    /// Wait for the round trip's measure when it has not come yet.
    fn timed(&self) {
        if self.settled() {
            return;
        }
        let rx = self.ping.lock().take();
        if let Some(rx) = rx {
            let _ = self.wait(&rx);
        }
    }

    /// Give back the bytes of a reply read (a [`Body`]'s), for the next
    /// big reply to be read into (not allocated and zeroed again).
    pub fn recycle(&self, b: Vec<u8>) {
        if b.capacity() == proto::PLACED_BUF {
            let mut bufs = self.bufs.lock();
            if bufs.len() < RECYCLED {
                bufs.push(b);
            }
        }
    }

    /// Keep tree `path`, opened as handle `dir` with metadata `meta` while
    /// resolving a location, for the first store that opens its root.
    pub(crate) fn opened_root(
        &self,
        path: &[u8],
        dir: u64,
        meta: ferry_engine::Meta,
        listing: Option<Asked>,
    ) {
        self.roots.lock().push((path.to_vec(), dir, meta, listing));
    }

    /// The handle and metadata of tree `path` opened ahead
    /// ([`Conn::opened_root`]), and its listing when it was asked with
    /// it; taken once.
    pub(crate) fn take_root(
        &self,
        path: &[u8],
    ) -> Option<(u64, ferry_engine::Meta, Option<Asked>)> {
        let mut roots = self.roots.lock();
        let i = roots.iter().position(|(p, ..)| p == path)?;
        let (_, dir, meta, listing) = roots.swap_remove(i);
        Some((dir, meta, listing))
    }

    /// A new handle number.
    pub fn handle(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// How many connections big files use: `--connections`, or the
    /// fewest cores of the two ends (one ssh stream is bound to one core
    /// by its cipher), up to `DEFAULT_CONNECTIONS`.
    pub fn width(&self) -> usize {
        match self.target.connections {
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
            let mut p = self.pending.lock();
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

/// The longest round trip to a host of this run (a request sent once its
/// connection's hello was read; waited for here when it was not back yet:
/// [`round_trip_known`] says whether it is); `None` before any connection.
pub fn round_trip() -> Option<std::time::Duration> {
    let conns: Vec<Arc<Conn>> = CONNS.lock().iter().map(|(_, c)| c.clone()).collect();
    for c in conns {
        c.timed();
    }
    match RTT_US.load(Ordering::Relaxed) {
        0 => None,
        us => Some(std::time::Duration::from_micros(us)),
    }
}

/// Whether [`round_trip`] would answer now, without waiting: every
/// connection of this run has its round trip measured (or is gone).
pub fn round_trip_known() -> bool {
    CONNS.lock().iter().all(|(_, c)| c.settled())
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
pub(crate) fn open_own(t: &Target) -> Result<Arc<Conn>, SessionError> {
    let c = open(t).map_err(|f| SessionError(f.line(t)))?;
    let mut w = WATCHES.lock();
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

/// Connections whose input was closed ([`end_all`]), until
/// [`close_all`] has waited for them.
static ENDING: Mutex<Vec<Arc<Conn>>> = Mutex::new(Vec::new());

/// Begin to end this run's sessions: each connection's input closed, so
/// that its `ferry serve` and then ssh exit, without waiting for them
/// ([`close_all`] does): what the run still does here (its summary, its
/// memory let go) goes on meanwhile. No request may be sent after this.
pub fn end_all() {
    let conns: Vec<Arc<Conn>> = CONNS
        .lock()
        .drain(..)
        .flat_map(|(_, c)| {
            let extra: Vec<Arc<Conn>> = c.extra.lock().drain(..).flatten().collect();
            std::iter::once(c).chain(extra)
        })
        .chain(WATCHES.lock().drain(..))
        .collect();
    for c in &conns {
        c.closing.store(true, Ordering::Relaxed);
        // An empty frame tells the writer to close the stream.
        let _ = c.tx.send(Vec::new().into());
    }
    ENDING.lock().extend(conns);
}

/// End this run's sessions: close each connection's input, so that its
/// `ferry serve` and then ssh exit, and wait for those that were sent a
/// change no reply confirmed (`conn::unconfirmed`: a few seconds at most),
/// so that what the server does with it is done when the run returns.
/// The others are not waited for: all they changed was confirmed request
/// by request, and their end (the input's end going there, the exit
/// status coming back) would cost the run a round trip more than `ssh
/// host true`. Their ssh exits on its own once that comes; it holds
/// nothing of the caller's (its input, output and errors are pipes to
/// this process).
pub fn close_all() {
    end_all();
    let conns: Vec<Arc<Conn>> = ENDING
        .lock()
        .drain(..)
        .filter(|c| c.unconfirmed.load(Ordering::Relaxed))
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    for c in &conns {
        let (lock, cv) = &c.closed;
        let mut done = lock.lock();
        while !*done {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            cv.wait_for(&mut done, left);
        }
    }
}

/// The connection to `t`, made once per run and shared. With self-install
/// one connection runs the start command ([`crate::install`]): it execs
/// the ferry there, or says what it found, in the same round trip. When
/// the remote has no ferry this binary may run, it is installed there
/// ([`crate::install::install`]) and run.
pub fn connect(t: &Target) -> Result<Arc<Conn>, SessionError> {
    connect_walking(t, None)
}

/// [`connect`], for a run that walks the tree at `walk` there: the ferry
/// there lists it ahead ([`Req::ListAhead`]), asked with the hello on a
/// new connection, in a request of its own on one made before.
pub fn connect_walking(t: &Target, walk: Option<&[u8]>) -> Result<Arc<Conn>, SessionError> {
    let mut conns = CONNS.lock();
    if let Some((_, c)) = conns.iter().find(|(k, _)| k == t) {
        if let Some(path) = walk {
            // (A lost connection fails the run's first request anyway.)
            let _ = c.send(&Req::ListAhead { path });
        }
        return Ok(c.clone());
    }
    let c = start(t, walk)?;
    conns.push((t.clone(), c.clone()));
    Ok(c)
}

/// A session to `t`'s ferry: found, checked, or installed first.
fn start(t: &Target, walk: Option<&[u8]>) -> Result<Arc<Conn>, SessionError> {
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
        let report = match open_look(t, look, sum, walk) {
            Ok(c) => return Ok(c),
            Err(Failed::Other(w)) => return Err(SessionError(w)),
            Err(Failed::NoFerry(w)) if !t.install || look != Look::Fast => {
                return Err(SessionError(w))
            }
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
                    return Err(SessionError(crate::install::not_this(
                        t,
                        &format!("{}/{name}", report.dir),
                        s,
                    )));
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
    Err(SessionError(Failed::Report(Report::default()).line(t)))
}

/// A new connection in place of `dead`, this run's connection to `t`
/// that was lost: made as the first was (to the remote ferry found or
/// installed then, with its protocol check), and shared from now on. One
/// another store made again already is taken as it is. The lost one's
/// extra connections are closed (new ones are opened when needed).
pub fn reconnect(t: &Target, dead: &Arc<Conn>) -> Result<Arc<Conn>, SessionError> {
    let mut conns = CONNS.lock();
    if let Some(i) = conns.iter().position(|(k, _)| k == t) {
        let c = &conns[i].1;
        if !Arc::ptr_eq(c, dead) && !c.gone.load(Ordering::Relaxed) {
            return Ok(c.clone());
        }
        let (_, old) = conns.swap_remove(i);
        for e in old.extra.lock().drain(..).flatten() {
            e.close();
        }
    }
    let c = open(dead.target()).map_err(|f| SessionError(f.line(t)))?;
    conns.push((t.clone(), c.clone()));
    Ok(c)
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
mod tests;
