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

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};

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

mod delta;

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
/// Bytes the pipes to and from ssh hold (the kernel's default is 64 KiB):
/// room for whole chunks while the other side is busy.
pub const PIPE_BYTES: usize = 1 << 20;

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
}

/// Serve on stdin and stdout until the other end closes the stream.
pub fn serve() -> io::Result<()> {
    serve_guarded(None)
}

/// The start command's guard, `guard` (a pid), which ends this session's
/// processes there when the connection goes before the session started
/// ([`crate::install::start_script`]): stopped once the hellos are
/// exchanged (from then on this process ends when its input ends).
static GUARD: std::sync::Mutex<Option<u32>> = std::sync::Mutex::new(None);

/// [`serve`], with the start command's guard to stop once started.
pub fn serve_guarded(guard: Option<u32>) -> io::Result<()> {
    *GUARD.lock().unwrap() = guard;
    // The descriptors themselves, past std's line buffering of stdout.
    use std::os::fd::AsFd;
    let input = std::fs::File::from(io::stdin().as_fd().try_clone_to_owned()?);
    let output = std::fs::File::from(io::stdout().as_fd().try_clone_to_owned()?);
    grow_pipe(input.as_fd());
    grow_pipe(output.as_fd());
    // A small buffer: a big file's chunk is read past it, straight into
    // its aligned buffer ([`read_request`]), and only what the buffer
    // holds is copied twice.
    serve_on(io::BufReader::with_capacity(64 << 10, input), output)
}

/// Give a pipe [`PIPE_BYTES`] of room (a hint: not a pipe, or a limit
/// below it, and it stays as it is).
pub fn grow_pipe(fd: std::os::fd::BorrowedFd<'_>) {
    let _ = rustix::pipe::fcntl_setpipe_size(fd, PIPE_BYTES);
}

/// Serve requests read from `input`, replies written to `output`.
pub fn serve_on(
    mut input: impl Read,
    output: impl crate::splice::Sink + Send + 'static,
) -> io::Result<()> {
    let mut output = output;
    proto::write_hello(&mut output)?;
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
    if let Some(pid) = GUARD.lock().unwrap().take() {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
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
    });
    let (work_tx, work_rx) = mpsc::sync_channel::<(u64, Vec<u8>)>(WORKERS * 4);
    let work_rx = Arc::new(Mutex::new(work_rx));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (st, rx) = (st.clone(), work_rx.clone());
            std::thread::spawn(move || work(&st, &rx))
        })
        .collect();
    let (disk_tx, disk_rx) = mpsc::sync_channel::<Job>(DISK_QUEUE);
    let disk = {
        let st = st.clone();
        std::thread::spawn(move || write_files(&st, &disk_rx))
    };
    let res = read_requests(&st, &mut input, &work_tx, &disk_tx);
    drop(work_tx);
    drop(disk_tx);
    for w in workers {
        let _ = w.join();
    }
    let _ = disk.join();
    // The client is gone: what it was writing is dropped with its
    // temporary (a partial stays, with what its record says is written).
    let left: Vec<_> = st.writers.lock().unwrap().drain().collect();
    for (_, w) in left {
        w.discard(&st.store);
    }
    let beat = st.beat.lock().unwrap().take();
    if let Some((stop, h)) = beat {
        drop(stop);
        let _ = h.join();
    }
    drop(st);
    let _ = writer.join();
    res
}

fn read_requests(
    st: &State,
    input: &mut impl Read,
    work: &SyncSender<(u64, Vec<u8>)>,
    disk: &SyncSender<Job>,
) -> io::Result<()> {
    // Watches of this client's trees: stopped (dropped) when it is gone.
    let mut watching = Vec::new();
    while let Some(next) = read_request(st, input)? {
        let (id, body) = match next {
            Incoming::Msg(id, body) => (id, body),
            Incoming::Chunk(c) => {
                if disk.send(Job::Chunk(c)).is_err() {
                    break;
                }
                continue;
            }
        };
        let to_disk = match proto::decode::<Req>(&body)? {
            Req::Watch { path, poll } => {
                let out = st.out.lock().unwrap().clone();
                watching.extend(crate::watch::serve_watch(out, id, path, poll));
                continue;
            }
            Req::Close { handle } => {
                st.dirs.lock().unwrap().remove(&handle);
                st.readers.lock().unwrap().remove(&handle);
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
            Req::ReadOnly => {
                ferry_local::append::read_only();
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
            true => disk.send(Job::Msg(id, body)).is_ok(),
            false => work.send((id, body)).is_ok(),
        };
        if !sent {
            break;
        }
    }
    Ok(())
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
                let mut buf = st.bufs.lock().unwrap().pop().unwrap_or_default();
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
    let mut beat = st.beat.lock().unwrap();
    if beat.is_some() {
        return;
    }
    let out = st.out.lock().unwrap().clone();
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

/// The disk thread: big files' creation, writes, commits and aborts, in
/// the order they came.
fn write_files(st: &State, rx: &Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let (id, body) = match job {
            Job::Msg(id, body) => (id, body),
            Job::Chunk(c) => {
                write_at(st, c.file, c.data(), c.offset, true);
                let mut bufs = st.bufs.lock().unwrap();
                if bufs.len() < DISK_QUEUE + 2 {
                    bufs.push(c.buf);
                }
                continue;
            }
        };
        let req = match proto::decode::<Req>(&body) {
            Ok(r) => r,
            Err(e) => {
                if id != 0 {
                    let _ = st.out.lock().unwrap().send(err_frame(id, &e).into());
                }
                continue;
            }
        };
        match req {
            Req::Create {
                dir,
                name,
                meta,
                file,
            } => {
                let w = match dir_of(st, dir).and_then(|d| {
                    let w = st.store.create_file(&d, &cname(name)?, &meta.0)?;
                    Ok(Writing::Open(d, w))
                }) {
                    Ok(w) => w,
                    Err(e) => Writing::Failed(e),
                };
                st.writers.lock().unwrap().insert(file, w);
            }
            Req::Write { file, data } => write_chunk(st, file, data),
            Req::WriteAt { file, offset, data } => write_at(st, file, data, offset, false),
            Req::SetLen { file, size } => {
                on_writer(st, file, |fd| Ok(rustix::fs::ftruncate(fd, size)?))
            }
            Req::PatchFrom {
                dir,
                file,
                old,
                block,
                size,
            } => delta::patch_from(st, dir, file, old, block, size),
            Req::Patch { file, ops } => delta::patch(st, file, ops),
            Req::PatchBegin {
                file,
                changed,
                hashes,
            } => delta::inplace_begin(st, file, &changed, &hashes),
            Req::PatchWrite { file, at, data } => delta::inplace_write(st, file, at, data),
            Req::PatchCommit {
                file,
                root,
                meta,
                fsync,
            } => {
                let f = delta::inplace_commit(st, id, file, &root, &meta.0, fsync);
                let _ = st.out.lock().unwrap().send(f.into());
            }
            Req::PatchAbort { file } => delta::inplace_abort(st, file),
            Req::Commit { file, .. } if st.deltas.unfinished(file) => {
                if let Some(Writing::Open(d, w)) = st.writers.lock().unwrap().remove(&file) {
                    st.store.abort(&d, w);
                }
                let e = io::Error::new(
                    io::ErrorKind::InvalidData,
                    "delta: the ops stopped before their end",
                );
                let _ = st.out.lock().unwrap().send(err_frame(id, &e).into());
            }
            Req::Abort { file, .. } => {
                st.deltas.drop_handle(file);
                let w = st.writers.lock().unwrap().remove(&file);
                if let Some(w) = w {
                    w.discard(&st.store);
                }
            }
            Req::PartOpen {
                dir,
                name,
                meta,
                ident,
                file,
            } => {
                let r = dir_of(st, dir).and_then(|d| {
                    let (w, done) = st.store.partial_writer(&d, &cname(name)?, &meta.0, ident)?;
                    let direct = Direct::reopen(w.fd());
                    let part = Writing::Part(d, w, meta.0.size, ident.to_owned(), direct);
                    Ok((part, done))
                });
                let f = match r {
                    Ok((w, done)) => {
                        st.writers.lock().unwrap().insert(file, w);
                        proto::frame(id, &Resp::Ranges(done.ranges()))
                    }
                    Err(e) => err_frame(id, &e),
                };
                let _ = st.out.lock().unwrap().send(f.into());
            }
            Req::PartAttach { path, file } => {
                let path = match local_path(path) {
                    Ok(p) => p,
                    Err(e) => {
                        st.writers.lock().unwrap().insert(file, Writing::Failed(e));
                        continue;
                    }
                };
                let w = rustix::fs::open(
                    OsStr::from_bytes(&path),
                    rustix::fs::OFlags::WRONLY
                        | rustix::fs::OFlags::NOFOLLOW
                        | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .map_or_else(
                    |e| Writing::Failed(e.into()),
                    |fd| {
                        let direct = Direct::reopen(fd.as_fd());
                        Writing::Attached(fd, direct, path.to_vec())
                    },
                );
                st.writers.lock().unwrap().insert(file, w);
            }
            Req::PartSync { file, flush, close } => {
                let r = {
                    let mut ws = st.writers.lock().unwrap();
                    let r = match ws.get(&file) {
                        Some(Writing::Failed(e)) => Err(match e.raw_os_error() {
                            Some(n) => io::Error::from_raw_os_error(n),
                            None => io::Error::new(e.kind(), e.to_string()),
                        }),
                        Some(w) => match (flush, w.fd()) {
                            (true, Some(fd)) => rustix::fs::fdatasync(fd).map_err(io::Error::from),
                            _ => Ok(()),
                        },
                        None => Err(bad_handle(file)),
                    };
                    if close {
                        ws.remove(&file);
                    }
                    r
                };
                let f = match r {
                    Ok(()) => proto::frame(id, &Resp::Ok),
                    Err(e) => err_frame(id, &e),
                };
                let _ = st.out.lock().unwrap().send(f.into());
            }
            Req::PartRecord { file, ranges } => {
                let ws = st.writers.lock().unwrap();
                if let Some(Writing::Part(_, w, size, ident, _)) = ws.get(&file) {
                    let mut set = ferry_local::range::RangeSet::new();
                    for (a, b) in ranges {
                        set.insert(a, b);
                    }
                    // Best effort: a record not made costs a resend.
                    let _ = ferry_local::download::record(w.fd(), *size, ident, &set);
                }
            }
            req => {
                let f = answer(st, id, req, &mut Listing::new());
                let _ = st.out.lock().unwrap().send(f.into());
            }
        }
    }
}

/// Append `data` to the file being written as `file`; a failure is kept
/// for its commit.
fn write_chunk(st: &State, file: u64, data: &[u8]) {
    let mut ws = st.writers.lock().unwrap();
    let Some(slot) = ws.get_mut(&file) else {
        return;
    };
    let Writing::Open(dir, w) = slot else {
        return;
    };
    let r = st
        .store
        .write_from(dir, w, &mut Bytes(data), data.len() as u64, None)
        .and_then(|n| {
            if n == data.len() as u64 {
                Ok(())
            } else {
                Err(io::Error::other("short write"))
            }
        });
    if let Err(e) = r {
        if let Some(Writing::Open(d, w)) = ws.insert(file, Writing::Failed(e)) {
            st.store.abort(&d, w);
        }
    }
}

/// Write `data` at `offset` of the file being written as `file`: a big
/// file's through its `O_DIRECT` descriptor (from where `data` is when it
/// is `aligned` as its offset is, else through an aligned copy).
fn write_at(st: &State, file: u64, data: &[u8], offset: u64, aligned: bool) {
    let mut ws = st.writers.lock().unwrap();
    let direct = |direct: &Direct, fd: BorrowedFd<'_>| match aligned {
        true => direct.write(fd, data, offset),
        false => direct.write_copied(fd, data, offset),
    };
    let r = match ws.get(&file) {
        Some(Writing::Part(_, w, _, _, d)) => direct(d, w.fd()),
        Some(Writing::Attached(fd, d, _)) => direct(d, fd.as_fd()),
        Some(Writing::Open(_, w)) => pwrite_all(w.fd(), data, offset),
        Some(Writing::Failed(_)) | None => return,
    };
    if let Err(e) = r {
        let full = ferry_engine::store::is_no_space(&e);
        if let Some(w) = ws.insert(file, Writing::Failed(e)) {
            w.fail(&st.store, full);
        }
    }
}

/// Do `f` to the file being written as `file`; a failure is kept for its
/// commit.
fn on_writer(st: &State, file: u64, f: impl FnOnce(BorrowedFd<'_>) -> io::Result<()>) {
    let mut ws = st.writers.lock().unwrap();
    let Some(fd) = ws.get(&file).and_then(Writing::fd) else {
        return;
    };
    if let Err(e) = f(fd) {
        let full = ferry_engine::store::is_no_space(&e);
        if let Some(w) = ws.insert(file, Writing::Failed(e)) {
            w.fail(&st.store, full);
        }
    }
}

fn pwrite_all(fd: std::os::fd::BorrowedFd<'_>, data: &[u8], at: u64) -> io::Result<()> {
    let mut n = 0;
    while n < data.len() {
        match rustix::io::pwrite(fd, &data[n..], at + n as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Tell the local store what the commit of `w` may replace, as the client
/// said it ([`Req::Put`], [`Req::Commit`]): checked right before the
/// rename, here.
fn expecting(s: &LocalStore, w: &mut LocalWriter, replacing: bool, expect: proto::Expect) {
    match expect {
        Some(at) => s.expect(w, at.map(Planned::from).as_ref()),
        None if replacing => s.replacing(w),
        None => {}
    }
}

/// Give the file being written its attributes and commit it: the reply
/// [`Req::Commit`] and [`Req::Put`] describe (`Ok`, or `Bool(false)`).
fn finish(
    s: &LocalStore,
    d: &LocalDir,
    mut w: LocalWriter,
    name: &[u8],
    meta: &Meta,
    fsync: bool,
    xattrs: Option<(u8, Attrs<'_>)>,
) -> io::Result<Resp<'static>> {
    let name = match cname(name) {
        Ok(n) => n,
        Err(e) => {
            s.abort(d, w);
            return Err(e);
        }
    };
    let mut kept = true;
    if let Some((sel, a)) = xattrs {
        let mut want = Xattrs::new();
        xattrs_of(&a, &mut want);
        match s.set_writer_xattrs(d, &mut w, meta, sel_of(sel), &want) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Unsupported => kept = false,
            Err(e) => {
                s.abort(d, w);
                return Err(e);
            }
        }
    }
    s.commit(d, w, &name, meta, fsync)?;
    Ok(if kept { Resp::Ok } else { Resp::Bool(false) })
}

fn work(st: &State, rx: &Mutex<Receiver<(u64, Vec<u8>)>>) {
    let mut listing = Listing::new();
    loop {
        let job = rx.lock().unwrap().recv();
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
            let _ = st.out.lock().unwrap().send(f);
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
    let (r, sparse) = st.readers.lock().unwrap().get(&file).cloned()?;
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

fn err_frame(id: u64, e: &io::Error) -> Vec<u8> {
    proto::frame(id, &Resp::Err(e.into()))
}

/// Carry out one request; its reply frame.
fn answer(st: &State, id: u64, req: Req<'_>, listing: &mut Listing) -> Vec<u8> {
    match answer_io(st, id, req, listing) {
        Ok(f) => f,
        Err(e) => err_frame(id, &e),
    }
}

fn answer_io(st: &State, id: u64, req: Req<'_>, listing: &mut Listing) -> io::Result<Vec<u8>> {
    let s = &st.store;
    let ok = |r: io::Result<()>| r.map(|()| proto::frame(id, &Resp::Ok));
    match req {
        Req::Root { path, dir, create } => {
            let p = &*local_path(path)?;
            let at = LocalStore::new(Path::new(OsStr::from_bytes(p)), 1);
            let opened = if create {
                let d = at.create_root()?;
                let m = at.open_root()?.map(|(_, m)| m);
                m.map(|m| (d, m))
            } else {
                at.open_root()?
            };
            let meta = opened.map(|(d, m)| {
                st.dirs.lock().unwrap().insert(dir, Arc::new(d));
                M(m)
            });
            Ok(proto::frame(id, &Resp::Meta(meta)))
        }
        Req::Space { dir } => {
            let (bytes, inodes) = ferry_local::local::free_space(dir_of(st, dir)?.fd())
                .ok_or_else(|| io::Error::other("statvfs failed"))?;
            Ok(proto::frame(id, &Resp::Space { bytes, inodes }))
        }
        Req::StatPath { path, follow } => {
            let p = &*local_path(path)?;
            let m = match ferry_local::stat_path(Path::new(OsStr::from_bytes(p)), follow) {
                Ok(m) => Some(M(m)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            Ok(proto::frame(id, &Resp::Meta(m)))
        }
        Req::Stat { dir, name } => {
            let m = s.stat(&*dir_of(st, dir)?, &cname(name)?)?;
            Ok(proto::frame(id, &Resp::Meta(m.map(M))))
        }
        Req::List { dir } => {
            let mut errors = Vec::new();
            s.list(&*dir_of(st, dir)?, b"", listing, &mut errors)?;
            let mut names = Vec::with_capacity(listing.len() * 16);
            let mut metas = Vec::with_capacity(listing.len());
            for e in listing.entries() {
                names.extend_from_slice(listing.name(e));
                names.push(0);
                metas.push(M(e.meta));
            }
            let errs: Vec<_> = errors
                .iter()
                .map(|e| (&e.name[..], WireErr::from(&e.err)))
                .collect();
            Ok(proto::frame(
                id,
                &Resp::Listing {
                    names: &names,
                    metas,
                    errors: errs,
                },
            ))
        }
        Req::OpenDir { dir, name, new } => {
            let d = s.open_dir(&*dir_of(st, dir)?, &cname(name)?)?;
            st.dirs.lock().unwrap().insert(new, Arc::new(d));
            ok(Ok(()))
        }
        Req::MakeDir { dir, name, new } => {
            let d = s.make_dir(&*dir_of(st, dir)?, &cname(name)?)?;
            st.dirs.lock().unwrap().insert(new, Arc::new(d));
            ok(Ok(()))
        }
        Req::SetDirMeta { dir, meta, what } => {
            ok(s.set_dir_meta(&*dir_of(st, dir)?, &meta.0, what_of(what)))
        }
        Req::Open {
            dir,
            name,
            file,
            xattrs,
        } => {
            let r = s.open_file(&*dir_of(st, dir)?, &cname(name)?)?;
            let mut x = Xattrs::new();
            if xattrs != 0 {
                s.reader_xattrs(&r, sel_of(xattrs), &mut x)?;
            }
            let size = r.current().map_or(u64::MAX, |c| c.0);
            if size > INLINE_MAX {
                return Ok(keep_open(st, id, file, r, &x));
            }
            // One byte past the size: a file that grew shows it.
            let mut data = vec![0u8; size as usize + 1];
            let n = pread_full(&r, 0, &mut data)?;
            Ok(proto::frame(
                id,
                &Resp::Opened {
                    data: Some(&data[..n]),
                    current: r.current(),
                    ino: 0,
                    sparse: false,
                    xattrs: attrs(&x),
                },
            ))
        }
        Req::OpenPath { path, file } => {
            let path = &*local_path(path)?;
            let p = Path::new(OsStr::from_bytes(path));
            let (dir, name) = match (p.parent(), p.file_name()) {
                (Some(d), Some(n)) => (
                    if d.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        d
                    },
                    n,
                ),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "not a file path",
                    ))
                }
            };
            let at = LocalStore::new(dir, 1);
            let (d, _) = at
                .open_root()?
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
            let r = at.open_file(&d, &cname(name.as_bytes())?)?;
            Ok(keep_open(st, id, file, r, &Xattrs::new()))
        }
        Req::Read { file, offset, len } => {
            let (r, sparse) = st
                .readers
                .lock()
                .unwrap()
                .get(&file)
                .cloned()
                .ok_or_else(|| bad_handle(file))?;
            let len = (len as usize).min(proto::CHUNK);
            let mut data = vec![0u8; len];
            let (n, zeros) = if sparse {
                read_data(&r, offset, &mut data)?
            } else {
                (pread_full(&r, offset, &mut data)?, Vec::new())
            };
            let covered = n + zeros.iter().map(|z| z.1 as usize).sum::<usize>();
            Ok(proto::frame_sized(
                id,
                &Resp::Data {
                    data: &data[..n],
                    current: if covered < len { r.current() } else { None },
                    zeros,
                },
                n,
            ))
        }
        Req::ReadLink { dir, name } => {
            let t = s.read_link(&*dir_of(st, dir)?, &cname(name)?)?;
            Ok(proto::frame(id, &Resp::Bytes(&t)))
        }
        Req::Put {
            dir,
            name,
            meta,
            fsync,
            data,
            xattrs,
            replacing,
            expect,
        } => {
            let d = dir_of(st, dir)?;
            let mut w = s.create_file(&d, &cname(name)?, &meta.0)?;
            expecting(s, &mut w, replacing, expect);
            match s.write_from(&d, &mut w, &mut Bytes(data), data.len() as u64, None) {
                Ok(n) if n == data.len() as u64 => {
                    let r = finish(s, &d, w, name, &meta.0, fsync, xattrs)?;
                    Ok(proto::frame(id, &r))
                }
                Ok(_) => {
                    s.abort(&d, w);
                    Err(io::Error::other("short write"))
                }
                Err(e) => {
                    s.abort(&d, w);
                    Err(e)
                }
            }
        }
        Req::Commit {
            file,
            name,
            meta,
            fsync,
            xattrs,
            replacing,
            expect,
            ..
        } => {
            let w = st.writers.lock().unwrap().remove(&file);
            match w {
                Some(Writing::Open(d, mut w)) => {
                    expecting(s, &mut w, replacing, expect);
                    let r = finish(s, &d, w, name, &meta.0, fsync, xattrs)?;
                    Ok(proto::frame(id, &r))
                }
                Some(Writing::Part(d, mut w, ..)) => {
                    ferry_local::download::forget_record(w.fd())?;
                    expecting(s, &mut w, replacing, expect);
                    let r = finish(s, &d, w, name, &meta.0, fsync, xattrs)?;
                    Ok(proto::frame(id, &r))
                }
                Some(Writing::Failed(e)) => Err(e),
                Some(Writing::Attached(..)) | None => Err(bad_handle(file)),
            }
        }
        Req::CreateEmpty {
            dir,
            name,
            meta,
            fsync,
        } => {
            let made = s.create_empty(&*dir_of(st, dir)?, &cname(name)?, &meta.0, fsync)?;
            Ok(proto::frame(id, &Resp::Bool(made)))
        }
        Req::Symlink {
            dir,
            name,
            target,
            meta,
        } => ok(s.create_symlink(&*dir_of(st, dir)?, &cname(name)?, target, &meta.0)),
        Req::SetMeta {
            dir,
            name,
            meta,
            what,
        } => ok(s.set_meta(&*dir_of(st, dir)?, &cname(name)?, &meta.0, what_of(what))),
        Req::Remove { dir, name, is_dir } => {
            let n = s.remove(&*dir_of(st, dir)?, &cname(name)?, is_dir)?;
            Ok(proto::frame(id, &Resp::Count(n)))
        }
        Req::RemovePlanned { dir, name, at } => {
            // The check at the act, here: one `statx` right before the
            // unlink, as a local run makes it.
            let n = s.remove_planned(&*dir_of(st, dir)?, &cname(name)?, &at.into())?;
            Ok(proto::frame(id, &Resp::Count(n)))
        }
        Req::RemoveEach { dir, name } => {
            let mut told = Vec::new();
            s.remove_each(&*dir_of(st, dir)?, &cname(name)?, &mut |p, z| {
                told.push((p.to_vec(), z))
            })?;
            Ok(proto::frame(id, &Resp::Removed(told)))
        }
        Req::Rename {
            from_dir,
            from,
            to_dir,
            to,
        } => ok(s.rename(
            &*dir_of(st, from_dir)?,
            &cname(from)?,
            &*dir_of(st, to_dir)?,
            &cname(to)?,
        )),
        Req::Rmdir { dir, name } => ok(s.rmdir(&*dir_of(st, dir)?, &cname(name)?)),
        Req::MakeWritable { dir } => {
            let b = s.make_writable(&*dir_of(st, dir)?)?;
            Ok(proto::frame(id, &Resp::Bool(b)))
        }
        Req::OwnLegacyPartial { dir, name } => {
            let b = s.is_own_legacy_partial(&*dir_of(st, dir)?, &cname(name)?);
            Ok(proto::frame(id, &Resp::Bool(b)))
        }
        Req::Info => Ok(proto::frame(
            id,
            &Resp::Info {
                root: rustix::process::geteuid().is_root(),
                cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            },
        )),
        Req::GetXattrs {
            dir,
            name,
            kind,
            sel,
        } => {
            let mut x = Xattrs::new();
            let name = name.map(cname).transpose()?;
            s.get_xattrs(
                &*dir_of(st, dir)?,
                name.as_deref(),
                kind.0,
                sel_of(sel),
                &mut x,
            )?;
            Ok(proto::frame(id, &Resp::Xattrs(attrs(&x))))
        }
        Req::SetXattrs {
            dir,
            name,
            meta,
            sel,
            want,
            have,
        } => {
            let (mut w, mut h) = (Xattrs::new(), Xattrs::new());
            xattrs_of(&want, &mut w);
            if let Some(have) = &have {
                xattrs_of(have, &mut h);
            }
            let name = name.map(cname).transpose()?;
            ok(s.set_xattrs(
                &*dir_of(st, dir)?,
                name.as_deref(),
                &meta.0,
                sel_of(sel),
                &w,
                have.is_some().then_some(&h),
            ))
        }
        Req::Special {
            dir,
            name,
            meta,
            replace,
        } => ok(s.create_special(&*dir_of(st, dir)?, &cname(name)?, &meta.0, replace)),
        Req::Link {
            from_dir,
            from_name,
            dir,
            name,
        } => ok(s.link(
            &*dir_of(st, from_dir)?,
            &cname(from_name)?,
            &*dir_of(st, dir)?,
            &cname(name)?,
        )),
        Req::Keep {
            dir,
            name,
            root,
            abs,
            base,
            path,
            overwrite,
            replacing,
            planned,
        } => {
            // The local store's keep (hard link, rename, copy), for the
            // tree at `root` as the client opened it.
            let root = &*local_path(root)?;
            let base = if abs {
                KeepBase::Abs(local_path(base)?.into_owned())
            } else {
                KeepBase::Root(base.to_vec())
            };
            let to = KeepTo {
                base: &base,
                path,
                overwrite,
                replacing,
                planned: planned.map(Planned::from),
            };
            let at = LocalStore::new(Path::new(OsStr::from_bytes(root)), 1);
            ok(at.keep_entry(&*dir_of(st, dir)?, &cname(name)?, &to))
        }
        Req::Sign { dir, name, min } => delta::sign(st, id, dir, name, min),
        Req::DiffRead { file, seq } => delta::diff_read(st, id, file, seq),
        Req::PatchHash {
            dir,
            name,
            old,
            size,
            block,
            key,
            file,
        } => Ok(delta::inplace_hash(
            st,
            id,
            (dir, name, &old.0),
            size,
            block,
            &key,
            file,
        )),
        Req::PatchHashes {
            file,
            old,
            size,
            block,
            key,
        } => delta::inplace_hashes(st, id, file, old, size, block, &key),
        Req::PatchBegin { .. }
        | Req::PatchWrite { .. }
        | Req::PatchCommit { .. }
        | Req::PatchAbort { .. }
        | Req::Close { .. }
        | Req::Diff { .. }
        | Req::PatchFrom { .. }
        | Req::Patch { .. }
        | Req::Create { .. }
        | Req::Write { .. }
        | Req::WriteAt { .. }
        | Req::SetLen { .. }
        | Req::PartOpen { .. }
        | Req::PartAttach { .. }
        | Req::PartSync { .. }
        | Req::PartRecord { .. }
        | Req::Abort { .. }
        | Req::Watch { .. }
        | Req::ReadOnly
        | Req::KeepAlive { .. } => {
            unreachable!("handled in order by the reading and disk threads")
        }
    }
}

/// Keep big file `r` open as handle `file`: the [`Resp::Opened`] frame
/// with its size, mtime, inode, whether it may have holes (fewer blocks
/// than its size fills) and its attributes `x`.
fn keep_open(st: &State, id: u64, file: u64, r: LocalReader, x: &Xattrs) -> Vec<u8> {
    let fd = r.as_fd().expect("a local file has a descriptor");
    let (ino, sparse) = rustix::fs::fstat(fd).map_or((0, false), |s| {
        (s.st_ino, (s.st_blocks as u64) * 512 < s.st_size as u64)
    });
    let current = r.current();
    st.readers
        .lock()
        .unwrap()
        .insert(file, (Arc::new(r), sparse));
    proto::frame(
        id,
        &Resp::Opened {
            data: None,
            current,
            ino,
            sparse,
            xattrs: attrs(x),
        },
    )
}

/// Read `buf.len()` bytes at `offset` of a file that may have holes: the
/// data into the front of `buf`, and the holes met as runs of zeros
/// (offset in the range, length) for [`Resp::Data`]. Fewer bytes in all
/// only at the end of the file.
fn read_data(r: &LocalReader, offset: u64, buf: &mut [u8]) -> io::Result<(usize, Vec<(u32, u32)>)> {
    use rustix::fs::SeekFrom;
    let fd = r.as_fd().expect("a local file has a descriptor");
    let size = rustix::fs::fstat(fd)?.st_size as u64;
    let end = (offset + buf.len() as u64).min(size.max(offset));
    let (mut at, mut n, mut zeros) = (offset, 0usize, Vec::new());
    while at < end {
        let data = match rustix::fs::seek(fd, SeekFrom::Data(at)) {
            Ok(d) => d.min(end),
            Err(rustix::io::Errno::NXIO) => end,
            Err(e) => return Err(e.into()),
        };
        if data > at {
            zeros.push(((at - offset) as u32, (data - at) as u32));
            at = data;
            continue;
        }
        let hole = match rustix::fs::seek(fd, SeekFrom::Hole(at)) {
            Ok(h) => h.min(end),
            Err(rustix::io::Errno::NXIO) => end,
            Err(e) => return Err(e.into()),
        };
        let want = (hole - at) as usize;
        let k = pread_full(r, at, &mut buf[n..n + want])?;
        n += k;
        at += k as u64;
        if k < want {
            break;
        }
    }
    if at == end && end < offset + buf.len() as u64 {
        // The end of the file: a read past it shows growth.
        n += pread_full(r, end, &mut buf[n..n + 1])?;
    }
    Ok((n, zeros))
}

fn bad_handle(h: u64) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("no handle {h}"))
}

fn dir_of(st: &State, h: u64) -> io::Result<Arc<LocalDir>> {
    st.dirs
        .lock()
        .unwrap()
        .get(&h)
        .cloned()
        .ok_or_else(|| bad_handle(h))
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
