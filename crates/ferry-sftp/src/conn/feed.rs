//! Requests on their way to ssh's stdin: gathered in batches, written
//! without waiting where the stream takes them, the rest by a writer
//! thread in their order.

use super::*;

/// Requests gathered to go to their sessions together, one write each
/// ([`Conn::start_in`]): what ssh sends in one packet, and the server
/// reads in one go, where requests sent one by one cost a packet and a
/// wake-up of every process on the way each. Sent when flushed, when big,
/// and when dropped; a thread must flush before it waits for a reply of
/// a request gathered.
#[derive(Default)]
pub struct Batch(Vec<(Arc<Conn>, Vec<u8>)>);

/// Bytes gathered for one session at most before they are sent.
pub(super) const BATCH_MAX: usize = 64 << 10;

impl Batch {
    pub(super) fn push(&mut self, conn: &Arc<Conn>, packet: Vec<u8>) {
        let i = match self.0.iter().position(|(c, _)| Arc::ptr_eq(c, conn)) {
            Some(i) => i,
            None => {
                self.0.push((conn.clone(), Vec::new()));
                self.0.len() - 1
            }
        };
        let buf = &mut self.0[i].1;
        if buf.is_empty() {
            *buf = packet;
        } else {
            buf.extend_from_slice(&packet);
        }
        if buf.len() >= BATCH_MAX {
            let buf = std::mem::take(buf);
            let _ = conn.tx.send(buf);
        }
    }

    /// Send what is gathered. (A session lost meanwhile fails the
    /// requests: their replies say so.)
    pub fn flush(&mut self) {
        for (conn, buf) in self.0.drain(..) {
            if !buf.is_empty() {
                let _ = conn.tx.send(buf);
            }
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Requests the reader thread makes (a commit's next steps, as its
/// replies come), gathered and sent in one write before it reads again.
pub(crate) struct Out<'a> {
    conn: &'a Conn,
    buf: Vec<u8>,
}

impl<'a> Out<'a> {
    pub(super) fn new(conn: &'a Conn) -> Out<'a> {
        Out {
            conn,
            buf: Vec::new(),
        }
    }

    /// What the server offers.
    pub(crate) fn ext(&self) -> Extensions {
        self.conn.ext
    }

    /// Bytes per write request.
    pub(crate) fn chunk(&self) -> usize {
        self.conn.chunk as usize
    }

    /// Start `req` for commit `f` (its reply comes to
    /// [`crate::pipe::on_reply`]).
    pub(crate) fn start(&mut self, req: Req, f: &Arc<crate::pipe::Shared>) -> io::Result<()> {
        let packet = self.conn.register_as(req, Slot::Flight(f.clone()))?;
        self.put(&packet);
        Ok(())
    }

    /// Send `req`, its reply waited for by nobody (closing a handle).
    pub(crate) fn send(&mut self, req: Req) {
        let id = self.conn.next.fetch_add(1, Ordering::Relaxed);
        self.put(&req.finish(id));
    }

    pub(super) fn put(&mut self, packet: &[u8]) {
        self.buf.extend_from_slice(packet);
        if self.buf.len() >= BATCH_MAX {
            self.flush();
        }
    }

    pub(super) fn flush(&mut self) {
        if !self.buf.is_empty() {
            let _ = self.conn.tx.send(std::mem::take(&mut self.buf));
        }
    }
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// ssh's stdin. A thread with requests to send writes them itself while
/// the socket takes them at once, waking no other thread (a wake-up of
/// another CPU is dear in a VM, and a session's replies each woke the
/// writer thread before: BENCHMARKS.md, "Issue 15: SFTP small push");
/// what it cannot take at once is queued for the writer thread, which
/// waits for room. Requests go out in the order they were sent.
pub(crate) struct Feed {
    /// ssh's stdin written without waiting (`MSG_DONTWAIT` on the
    /// socket; a pipe's own open file description set non-blocking, when
    /// `/proc` gives one); `None`: every write is the writer thread's.
    now: Option<Direct>,
    st: Mutex<FeedState>,
    cv: Condvar,
    quiet: Arc<Quiet>,
}

#[derive(Default)]
pub(super) struct FeedState {
    /// For the writer thread, oldest first.
    queue: VecDeque<Vec<u8>>,
    /// The writer thread has bytes to write (queued or in hand): others
    /// queue theirs behind them. Not busy, the queue is empty.
    busy: bool,
    /// A write failed: ssh is gone.
    dead: bool,
}

impl Feed {
    pub(super) fn start(stdin: Writing<std::fs::File>) -> Arc<Feed> {
        let now = Direct::of(stdin.inner.as_fd());
        let f = Arc::new(Feed {
            now,
            st: Mutex::new(FeedState::default()),
            cv: Condvar::new(),
            quiet: stdin.quiet.clone(),
        });
        let w = f.clone();
        std::thread::spawn(move || w.write_queued(stdin));
        f
    }

    /// The session is over: nothing more is written (the writer thread
    /// ends, closing ssh's stdin).
    pub(super) fn close(&self) {
        self.st.lock().dead = true;
        self.cv.notify_one();
    }

    /// Send `buf` (requests, whole): `Err` with it when ssh is gone.
    pub(super) fn send(&self, buf: Vec<u8>) -> Result<(), Vec<u8>> {
        let mut st = self.st.lock();
        if st.dead {
            return Err(buf);
        }
        if st.busy {
            st.queue.push_back(buf);
            return Ok(());
        }
        let mut at = 0;
        if let Some(now) = self.now.as_ref() {
            while at < buf.len() {
                match now.write(&buf[at..]) {
                    Ok(n) => at += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        st.dead = true;
                        return Err(buf);
                    }
                }
            }
            if at > 0 {
                // Progress, for the I/O timeout's watch.
                self.quiet.touch();
            }
        }
        if at < buf.len() {
            let mut buf = buf;
            buf.drain(..at);
            st.queue.push_back(buf);
            st.busy = true;
            self.cv.notify_one();
        }
        Ok(())
    }

    /// The writer thread: what the others queued, waiting for room. When
    /// it ends, ssh's stdin ends.
    pub(super) fn write_queued(&self, stdin: Writing<std::fs::File>) {
        // Declared first, dropped last: after `out` wrote what it holds.
        let _end = EndOfInput(
            is_socket(stdin.inner.as_fd())
                .then(|| stdin.inner.try_clone().ok())
                .flatten(),
        );
        let mut out = io::BufWriter::with_capacity(256 << 10, stdin);
        let mut st = self.st.lock();
        loop {
            while !st.busy && !st.dead {
                self.cv.wait(&mut st);
            }
            if st.dead {
                return;
            }
            if st.queue.is_empty() {
                st.busy = false;
                continue;
            }
            let bufs: Vec<Vec<u8>> = st.queue.drain(..).collect();
            drop(st);
            let mut ok = true;
            for b in &bufs {
                // A big request (a write's data) goes to ssh as it is, not
                // copied into the buffer first; small ones are gathered.
                ok = ok
                    && if b.len() >= DIRECT_MIN {
                        out.flush().and_then(|()| out.get_mut().write_all(b))
                    } else {
                        out.write_all(b)
                    }
                    .is_ok();
            }
            ok = ok && out.flush().is_ok();
            st = self.st.lock();
            if !ok {
                // ssh is gone: its stdout ends, and the reader thread
                // fails what is pending.
                st.dead = true;
                st.busy = false;
                st.queue.clear();
                return;
            }
        }
    }
}

/// Requests at least this big skip the writer thread's buffer.
pub(super) const DIRECT_MIN: usize = 64 << 10;

/// Whether `fd` is a socket (ssh's stdin is one unless
/// `FERRY_SFTP_PIPES` asked for pipes).
pub(super) fn is_socket(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket
    })
}

/// Shuts the socket of ssh's stdin for writing when dropped (ssh sees
/// the end of its input: the replies' descriptor of the same socket stays
/// open); `None` for a pipe, whose last close does that.
pub(super) struct EndOfInput(Option<std::fs::File>);

impl Drop for EndOfInput {
    fn drop(&mut self) {
        if let Some(f) = &self.0 {
            let _ = rustix::net::shutdown(f, rustix::net::Shutdown::Write);
        }
    }
}

/// Writes to ssh's stdin that never wait, beside the writer thread's
/// blocking ones on the same stream.
pub(super) enum Direct {
    /// A socket: `send` with `MSG_DONTWAIT` (the descriptor stays blocking).
    Socket(OwnedFd),
    /// A pipe opened again, non-blocking ([`reopen_nonblocking`]).
    Pipe(std::fs::File),
}

impl Direct {
    pub(super) fn of(fd: std::os::fd::BorrowedFd<'_>) -> Option<Direct> {
        if is_socket(fd) {
            return fd.try_clone_to_owned().ok().map(Direct::Socket);
        }
        reopen_nonblocking(fd).map(Direct::Pipe)
    }

    pub(super) fn write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Direct::Socket(fd) => {
                use rustix::net::SendFlags;
                Ok(rustix::net::send(
                    fd,
                    buf,
                    SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
                )?)
            }
            Direct::Pipe(f) => {
                let mut f: &std::fs::File = f;
                f.write(buf)
            }
        }
    }
}

/// `fd` (a pipe) opened again as its own open file description, not
/// blocking: writes that do not wait, beside the blocking ones of the
/// writer thread on `fd`.
pub(super) fn reopen_nonblocking(fd: std::os::fd::BorrowedFd<'_>) -> Option<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    let fd: OwnedFd = rustix::fs::open(
        path.as_str(),
        OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    Some(std::fs::File::from(fd))
}
