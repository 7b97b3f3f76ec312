//! `ferry serve`: this machine's files for a ferry at the other end of a
//! byte stream (stdin/stdout under ssh), through the same [`LocalStore`]
//! as a local run: the fast scanner, the atomic temporary + rename writes,
//! exact metadata.
//!
//! One thread reads requests. Closing a handle it carries out itself; the
//! requests of big files being written (creation, writes, commit, abort),
//! which must keep their order, go to one disk thread, so the stream is
//! read on while a chunk goes to disk; everything else goes to a pool of
//! workers, so many requests run at once (listings, stats, whole small
//! files) and a slow one holds up no other. Replies go through one writer
//! thread, which writes as many as are ready and then flushes.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;

use ferry_engine::entry::{Listing, Meta};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::store::{Planned, SourceFile, Store, StoreExt};
use ferry_engine::xattr::Xattrs;
use ferry_local::download::Direct;
use ferry_local::local::{LocalDir, LocalReader, LocalWriter};
use ferry_local::LocalStore;

use crate::proto::{
    self, attrs, sel_of, what_of, xattrs_of, Attrs, Hello, Req, Resp, WireErr, INLINE_MAX, M,
};

mod ahead;
mod answer;
mod delta;
mod push;
#[cfg(test)]
mod tests;
mod write;

use answer::answer;
use write::{expecting, finish, on_writer, write_files};

/// A path the client sent, as this machine names it: a leading `~` is the
/// home of this user (`~`, `~/rest`), `~user` that user's (`~user/rest`),
/// as a shell, rsync and scp take it; an empty path is the working
/// directory (the home under ssh). Any other path is as sent.
pub fn local_path(p: &[u8]) -> io::Result<std::borrow::Cow<'_, [u8]>> {
    use std::borrow::Cow;
    if p.is_empty() {
        return Ok(Cow::Borrowed(b"."));
    }
    if p[0] != b'~' {
        return Ok(Cow::Borrowed(p));
    }
    let end = p.iter().position(|b| *b == b'/').unwrap_or(p.len());
    let home = home_of(&p[1..end])?;
    let mut out = home;
    out.extend_from_slice(&p[end..]);
    Ok(Cow::Owned(out))
}

/// The home directory of `user` (this process's user when empty), as the
/// password database has it (NSS: also users of a directory service).
#[allow(unsafe_code)]
fn home_of(user: &[u8]) -> io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    let name = String::from_utf8_lossy(user);
    let unknown = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("~{name}: no such user on this host"),
        )
    };
    let cname = CString::new(user).map_err(|_| unknown())?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: every pointer is to a live local of the size given; the
        // result points into `pw` and `buf`, read before they go.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe {
            if user.is_empty() {
                libc::getpwuid_r(
                    libc::geteuid(),
                    &mut pw,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut res,
                )
            } else {
                libc::getpwnam_r(
                    cname.as_ptr(),
                    &mut pw,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut res,
                )
            }
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        if res.is_null() || pw.pw_dir.is_null() {
            if user.is_empty() {
                // No entry for this user: the home ssh started in.
                return std::env::current_dir().map(|d| d.into_os_string().into_vec());
            }
            return Err(unknown());
        }
        // SAFETY: a NUL-terminated string in `buf`.
        let dir = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
        return Ok(dir.to_bytes().to_vec());
    }
}

/// Workers carrying out requests at once.
const WORKERS: usize = 16;
/// Requests queued for the disk thread at most (chunks of big files).
const DISK_QUEUE: usize = 8;

/// A file being written: open, or failed (the error goes back on commit).
enum Writing {
    Open(Arc<LocalDir>, LocalWriter),
    /// A resumable partial ([`Req::PartOpen`]): its size and identity, and
    /// its `O_DIRECT` descriptor (its ranges go past the page cache, whose
    /// copy costs this end more CPU than the stream). A failure or a lost
    /// client leaves it, with its record, for a rerun.
    Part(Arc<LocalDir>, LocalWriter, u64, String, Direct),
    /// Another connection's partial, written here at offsets
    /// ([`Req::PartAttach`]), its `O_DIRECT` descriptor and its path.
    Attached(OwnedFd, Direct, Vec<u8>),
    Failed(io::Error),
}

impl Writing {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Writing::Open(_, w) | Writing::Part(_, w, ..) => Some(w.fd()),
            Writing::Attached(fd, ..) => Some(fd.as_fd()),
            Writing::Failed(_) => None,
        }
    }

    /// Let go of it: a temporary is removed, a partial kept.
    fn discard(self, store: &LocalStore) {
        if let Writing::Open(d, w) = self {
            store.abort(&d, w);
        }
    }

    /// Let go of it after a failure: as [`Writing::discard`], except that
    /// a partial met by a full disk (`full`), which cannot complete, is
    /// emptied and removed (it would keep the disk full for nothing; every
    /// connection writing it then fails too).
    fn fail(self, store: &LocalStore, full: bool) {
        if full {
            match &self {
                Writing::Part(d, w, ..) => {
                    if let Some(name) = w.partial_name() {
                        ferry_local::download::give_up(d.fd(), name, w.fd());
                    }
                }
                Writing::Attached(fd, _, path) => {
                    let p = Path::new(OsStr::from_bytes(path));
                    if let (Some(dir), Some(name)) = (p.parent(), p.file_name()) {
                        let dir = if dir.as_os_str().is_empty() {
                            Path::new(".")
                        } else {
                            dir
                        };
                        if let (Ok(dfd), Ok(name)) = (
                            rustix::fs::open(
                                dir,
                                rustix::fs::OFlags::RDONLY
                                    | rustix::fs::OFlags::DIRECTORY
                                    | rustix::fs::OFlags::CLOEXEC,
                                rustix::fs::Mode::empty(),
                            ),
                            CString::new(name.as_bytes()),
                        ) {
                            ferry_local::download::give_up(dfd.as_fd(), &name, fd.as_fd());
                        }
                    }
                }
                Writing::Open(..) | Writing::Failed(_) => {}
            }
        }
        self.discard(store);
    }
}

struct State {
    store: LocalStore,
    dirs: Mutex<HashMap<u64, Arc<LocalDir>>>,
    /// Open files, and whether each may have holes.
    readers: Mutex<HashMap<u64, (Arc<LocalReader>, bool)>>,
    writers: Mutex<HashMap<u64, Writing>>,
    out: Mutex<Sender<proto::Out>>,
    /// Chunk buffers the disk thread is done with ([`Chunk`]).
    bufs: Mutex<Vec<Vec<u8>>>,
    /// Delta rebuilds and diffs under way.
    deltas: delta::Deltas,
    /// The heartbeat ([`Req::KeepAlive`]): stopped when its sender is
    /// dropped.
    beat: Mutex<Option<(Sender<()>, std::thread::JoinHandle<()>)>>,
    /// Listings made ahead ([`Req::ListAhead`]).
    ahead: ahead::Ahead,
    /// This machine's cores (for this process: its CPU quota), asked once.
    cores: usize,
    /// The first flight was answered unasked ([`push`]): the client's
    /// `Info`, `StatRoot` and root `List` of it are not answered again.
    pushed: bool,
}

/// Serve on stdin and stdout until the other end closes the stream.
pub fn serve() -> io::Result<()> {
    serve_guarded(None, None)
}

/// The start command's guard, `guard` (a pid), which ends this session's
/// processes there when the connection goes before the session started
/// ([`crate::install::start_script`]): stopped once the hellos are
/// exchanged (from then on this process ends when its input ends).
static GUARD: parking_lot::Mutex<Option<u32>> = parking_lot::Mutex::new(None);

/// [`serve`], with the start command's guard to stop once started, and
/// the tree the client walks when the start command names it (`walk`:
/// its first flight answered unasked, [`serve_on_pushing`]).
pub fn serve_guarded(guard: Option<u32>, walk: Option<&[u8]>) -> io::Result<()> {
    *GUARD.lock() = guard;
    // The descriptors themselves, past std's line buffering of stdout.
    use std::os::fd::AsFd;
    let input = std::fs::File::from(io::stdin().as_fd().try_clone_to_owned()?);
    let output = std::fs::File::from(io::stdout().as_fd().try_clone_to_owned()?);
    crate::spawn::grow_pipe(input.as_fd());
    crate::spawn::grow_pipe(output.as_fd());
    // A small buffer: a big file's chunk is read past it, straight into
    // its aligned buffer ([`read_request`]), and only what the buffer
    // holds is copied twice.
    serve_on_pushing(io::BufReader::with_capacity(64 << 10, input), output, walk)
}

/// Serve requests read from `input`, replies written to `output`.
pub fn serve_on(
    input: io::BufReader<impl Read>,
    output: impl crate::splice::Sink + Send + 'static,
) -> io::Result<()> {
    serve_on_pushing(input, output, None)
}

/// [`serve_on`]; with `walk`, the first flight of a walk of that tree is
/// answered from the start, unasked (`serve/push.rs`).
pub fn serve_on_pushing(
    mut input: io::BufReader<impl Read>,
    output: impl crate::splice::Sink + Send + 'static,
    walk: Option<&[u8]>,
) -> io::Result<()> {
    let mut output = output;
    proto::write_hello(&mut output)?;
    // (The round trip's start: `Req::Ping`.)
    let hello = std::time::Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (out_tx, out_rx) = mpsc::channel::<proto::Out>();
    let writer = std::thread::spawn(move || proto::write_out(output, out_rx));
    let st = Arc::new(State {
        store: LocalStore::new("/", cores),
        dirs: Mutex::new(HashMap::new()),
        readers: Mutex::new(HashMap::new()),
        writers: Mutex::new(HashMap::new()),
        out: Mutex::new(out_tx),
        bufs: Mutex::new(Vec::new()),
        deltas: delta::Deltas::default(),
        beat: Mutex::new(None),
        ahead: ahead::Ahead::default(),
        cores,
        pushed: walk.is_some(),
    });
    if let Some(path) = walk {
        push::push(&st, path);
    }
    match proto::read_hello(&mut input)? {
        Hello::Ferry { protocol, .. } if protocol == proto::PROTOCOL => {}
        Hello::Ferry { protocol, version } => {
            return Err(io::Error::other(format!(
            "the client is ferry {version} (protocol {protocol}), this is ferry {} (protocol {})",
            proto::version(),
            proto::PROTOCOL
        )))
        }
        Hello::Other(_) => return Err(io::Error::other("the client is not a ferry")),
    }
    if let Some(pid) = GUARD.lock().take() {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    let (work_tx, work_rx) = mpsc::sync_channel::<(u64, Vec<u8>)>(WORKERS * 4);
    let work_rx = Arc::new(Mutex::new(work_rx));
    // Started beside the reading of the first requests (the hello's
    // `Info` is answered by the reading thread meanwhile): the requests
    // wait in the queue for them.
    let workers = {
        let st = st.clone();
        std::thread::spawn(move || -> Vec<_> {
            (0..WORKERS)
                .map(|_| {
                    let (st, rx) = (st.clone(), work_rx.clone());
                    std::thread::spawn(move || work(&st, &rx))
                })
                .collect()
        })
    };
    let (disk_tx, disk_rx) = mpsc::sync_channel::<Job>(DISK_QUEUE);
    let disk = {
        let st = st.clone();
        std::thread::spawn(move || write_files(&st, &disk_rx))
    };
    let res = read_requests(&st, hello, &mut input, &work_tx, &disk_tx);
    drop(work_tx);
    drop(disk_tx);
    for w in workers.join().unwrap_or_default() {
        let _ = w.join();
    }
    let _ = disk.join();
    // The client is gone: what it was writing is dropped with its
    // temporary (a partial stays, with what its record says is written).
    let left: Vec<_> = st.writers.lock().drain().collect();
    for (_, w) in left {
        w.discard(&st.store);
    }
    let beat = st.beat.lock().take();
    if let Some((stop, h)) = beat {
        drop(stop);
        let _ = h.join();
    }
    drop(st);
    let _ = writer.join();
    res
}

fn read_requests(
    st: &Arc<State>,
    hello: std::time::Instant,
    input: &mut io::BufReader<impl Read>,
    work: &SyncSender<(u64, Vec<u8>)>,
    disk: &SyncSender<Job>,
) -> io::Result<()> {
    // Watches of this client's trees: stopped (dropped) when it is gone.
    let mut watching = Vec::new();
    // The replies made on this thread (`Info`, `StatRoot`, `OpenDir`,
    // `OpenDirAhead`), sent together once the requests read so far are
    // done, before it waits for more: a client's hundred `OpenDirAhead`s
    // are answered in one write (one ssh packet), not in a hundred. Never
    // held while this thread waits (for input, or for room in a queue).
    let mut here = Here::default();
    loop {
        if input.buffer().is_empty() {
            here.flush(st);
        }
        let Some(next) = read_request(st, input)? else {
            break;
        };
        let (id, body) = match next {
            Incoming::Msg(id, body) => (id, body),
            Incoming::Chunk(c) => {
                if !here.send(st, disk, Job::Chunk(c)) {
                    break;
                }
                continue;
            }
        };
        let req = proto::decode::<Req>(&body)?;
        if st.pushed
            && matches!(
                (id, &req),
                (proto::INFO_ID, Req::Info)
                    | (proto::FIRST_STAT, Req::StatRoot { .. })
                    | (proto::FIRST_LIST, Req::List { .. })
            )
        {
            // Answered already, unasked ([`push`]).
            continue;
        }
        if !req.changes_nothing() {
            st.ahead.stop();
        }
        let to_disk = match req {
            Req::ListAhead { path } => {
                ahead::Ahead::start(st, path);
                continue;
            }
            // Sent with the hello, and waited for before anything else:
            // answered here, not behind the workers' start, and sent at once:
            // the client reads it as the first frame after the hello (a
            // worker's answer to the first flight's `List` must not go
            // before it).
            Req::Info => {
                here.reply(id, Ok(answer::info(st, id)));
                here.flush(st);
                continue;
            }
            Req::Ping => {
                // (Not the time this thread waited for room in a queue
                // meanwhile: the first flight's listings, not the link.)
                let us = hello.elapsed().saturating_sub(here.waited).as_micros() as u64;
                here.reply(id, Ok(proto::frame(id, &Resp::Count(us))));
                continue;
            }
            Req::Watch { path, poll } => {
                let out = st.out.lock().clone();
                watching.extend(crate::watch::serve_watch(out, id, path, poll));
                continue;
            }
            Req::Close { handle } => {
                st.dirs.lock().remove(&handle);
                st.readers.lock().remove(&handle);
                st.deltas.drop_handle(handle);
                continue;
            }
            Req::Diff { file, sig } => {
                delta::start_diff(st, file, sig);
                continue;
            }
            Req::KeepAlive { ms } => {
                start_beat(st, ms);
                continue;
            }
            // Opened here, in the order the requests came (protocol 14):
            // a client may send a directory's `List` right behind its
            // `OpenDir`, and that `List`, run by a worker, finds the
            // handle (one round trip for both, not two).
            // So is a tree's (protocol 15): its listing may come right
            // behind.
            Req::StatRoot { path, dir } => {
                here.reply(id, answer::stat_root(st, id, path, dir));
                continue;
            }
            Req::OpenDir { dir, name, new } => {
                here.reply(id, answer::open_dir(st, id, dir, name, new));
                continue;
            }
            Req::OpenDirAhead { dir, name, new } => {
                here.reply(id, answer::open_dir_ahead(st, id, dir, name, new));
                continue;
            }
            Req::ReadOnly => {
                st.store.set_read_only();
                continue;
            }
            Req::Create { .. }
            | Req::Write { .. }
            | Req::WriteAt { .. }
            | Req::SetLen { .. }
            | Req::Commit { .. }
            | Req::PartOpen { .. }
            | Req::PartAttach { .. }
            | Req::PartSync { .. }
            | Req::PartRecord { .. }
            | Req::Abort { .. }
            | Req::PatchFrom { .. }
            | Req::Patch { .. }
            | Req::PatchBegin { .. }
            | Req::PatchWrite { .. }
            | Req::PatchCommit { .. }
            | Req::PatchAbort { .. } => true,
            _ => false,
        };
        let sent = match to_disk {
            true => here.send(st, disk, Job::Msg(id, body)),
            false => here.send(st, work, (id, body)),
        };
        if !sent {
            break;
        }
    }
    here.flush(st);
    Ok(())
}

/// Replies made on the reading thread, not sent yet ([`read_requests`]).
#[derive(Default)]
struct Here {
    frames: Vec<u8>,
    /// How long that thread waited for room in a queue so far.
    waited: std::time::Duration,
}

impl Here {
    fn reply(&mut self, id: u64, f: io::Result<Vec<u8>>) {
        if id != 0 {
            self.frames
                .extend_from_slice(&f.unwrap_or_else(|e| err_frame(id, &e)));
        }
    }

    fn flush(&mut self, st: &State) {
        if !self.frames.is_empty() {
            let _ = st.out.lock().send(std::mem::take(&mut self.frames).into());
        }
    }

    /// `job` queued; what is held is sent first when the queue is full
    /// (this thread then waits). False: the queue is gone.
    fn send<T>(&mut self, st: &State, q: &SyncSender<T>, job: T) -> bool {
        match q.try_send(job) {
            Ok(()) => true,
            Err(mpsc::TrySendError::Full(job)) => {
                self.flush(st);
                let waited = std::time::Instant::now();
                let sent = q.send(job).is_ok();
                self.waited += waited.elapsed();
                sent
            }
            Err(mpsc::TrySendError::Disconnected(_)) => false,
        }
    }
}

/// Work for the disk thread, in the order it came.
enum Job {
    /// A request's frame.
    Msg(u64, Vec<u8>),
    /// A big file's bytes ([`Req::WriteAt`]), read off the stream already
    /// aligned for a direct write.
    Chunk(Chunk),
}

/// What [`read_request`] read.
enum Incoming {
    /// A frame: its id and message.
    Msg(u64, Vec<u8>),
    /// A [`Req::WriteAt`] of a big file's bytes.
    Chunk(Chunk),
}

/// The bytes of a [`Req::WriteAt`] read off the stream into a buffer where
/// they sit as aligned in memory as their offset is in the file, so that
/// the `O_DIRECT` write takes them from there (no copy into an aligned
/// buffer first).
struct Chunk {
    file: u64,
    offset: u64,
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Chunk {
    fn data(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }
}

/// Frames at least this long are looked at for a [`Req::WriteAt`].
const CHUNK_MIN: usize = 64 << 10;
/// Bytes of a chunk buffer: a chunk and room to place it.
const CHUNK_BUF: usize = proto::CHUNK + 2 * ferry_engine::piece::DIRECT_ALIGN;

/// Read the next frame (`None`: the end of the stream between frames); a
/// big [`Req::WriteAt`] as a [`Chunk`].
fn read_request(st: &State, input: &mut impl Read) -> io::Result<Option<Incoming>> {
    let Some((id, body_len)) = proto::read_head(input)? else {
        return Ok(None);
    };
    let mut start = [0u8; 32];
    let mut got = 0;
    if body_len >= CHUNK_MIN {
        input.read_exact(&mut start)?;
        got = start.len();
        if let Some((file, offset, k)) = proto::parse_write_at(&start) {
            let data_len = body_len - k;
            if id == 0 && data_len <= proto::CHUNK && k <= start.len() {
                let mut buf = st.bufs.lock().pop().unwrap_or_default();
                if buf.len() != CHUNK_BUF {
                    buf = vec![0u8; CHUNK_BUF];
                }
                let align = ferry_engine::piece::DIRECT_ALIGN;
                let at = buf.as_ptr().align_offset(align) + (offset % align as u64) as usize;
                let first = got - k;
                buf[at..at + first].copy_from_slice(&start[k..]);
                input.read_exact(&mut buf[at + first..at + data_len])?;
                return Ok(Some(Incoming::Chunk(Chunk {
                    file,
                    offset,
                    buf,
                    at,
                    len: data_len,
                })));
            }
        }
    }
    let mut body = Vec::with_capacity(body_len);
    body.extend_from_slice(&start[..got]);
    Ok(Some(Incoming::Msg(
        id,
        proto::read_body(input, body, body_len)?,
    )))
}

/// Send a heartbeat (an `Ok` of id 0) every `ms` milliseconds (100 at
/// least) until the session ends; a second request changes nothing.
fn start_beat(st: &State, ms: u64) {
    let mut beat = st.beat.lock();
    if beat.is_some() {
        return;
    }
    let out = st.out.lock().clone();
    let (stop, stopped) = mpsc::channel::<()>();
    let every = std::time::Duration::from_millis(ms.max(100));
    let h = std::thread::spawn(move || {
        let f = proto::frame(0, &Resp::Ok);
        while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
            if out.send(f.clone().into()).is_err() {
                return;
            }
        }
    });
    *beat = Some((stop, h));
}

fn work(st: &State, rx: &Mutex<Receiver<(u64, Vec<u8>)>>) {
    let mut listing = Listing::new();
    loop {
        let job = rx.lock().recv();
        let Ok((id, body)) = job else {
            return;
        };
        let f = match proto::decode::<Req>(&body) {
            Ok(Req::Read { file, offset, len }) if id != 0 => {
                match read_piped(st, id, file, offset, len) {
                    Some(Ok(out)) => out,
                    Some(Err(e)) => err_frame(id, &e).into(),
                    None => answer(st, id, Req::Read { file, offset, len }, &mut listing).into(),
                }
            }
            Ok(req) => answer(st, id, req, &mut listing).into(),
            Err(e) => proto::frame(id, &Resp::Err(WireErr::from(&e))).into(),
        };
        if id != 0 {
            let _ = st.out.lock().send(f);
        }
    }
}

/// Answer [`Req::Read`] through a pipe ([`crate::splice`]): the bytes
/// spliced from the file into the reply, not copied here. `None` where
/// that way is not for this read (a file that may have holes, a range
/// starting inside a page that a pipe cannot take whole, no pipe, a file
/// that cannot be spliced from, an unknown handle): answered the copying
/// way.
fn read_piped(
    st: &State,
    id: u64,
    file: u64,
    offset: u64,
    len: u32,
) -> Option<io::Result<proto::Out>> {
    let len = (len as usize).min(proto::CHUNK);
    let (r, sparse) = st.readers.lock().get(&file).cloned()?;
    if sparse || len > crate::splice::room(offset) {
        return None;
    }
    let mut pipe = crate::splice::pipe()?;
    let n = match pipe.fill(r.as_fd()?, offset, len) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => return None,
        Err(e) => return Some(Err(e)),
    };
    // A short read is the end of the file, as for the copying way.
    let current = if n < len { r.current() } else { None };
    let (head, tail) = proto::data_parts(id, n, current);
    Some(Ok(proto::Out::Piped { head, pipe, tail }))
}

/// Send the reply of request `id`, answered by the reading thread (its
/// error frame for an error; nothing for a request of id 0).
fn err_frame(id: u64, e: &io::Error) -> Vec<u8> {
    proto::frame(id, &Resp::Err(e.into()))
}

/// Carry out one request; its reply frame.
fn bad_handle(h: u64) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("no handle {h}"))
}

fn dir_of(st: &State, h: u64) -> io::Result<Arc<LocalDir>> {
    st.dirs.lock().get(&h).cloned().ok_or_else(|| bad_handle(h))
}

fn cname(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))
}

/// [`pread_full`](ferry_engine::piece::pread_full) of an open local file.
fn pread_full(r: &LocalReader, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let fd = r.as_fd().expect("a local file has a descriptor");
    ferry_engine::piece::pread_full(fd, buf, offset)
}

/// Bytes of a request as the source of a write.
struct Bytes<'a>(&'a [u8]);

impl SourceFile for Bytes<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Read::read(&mut self.0, buf)
    }
    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}
