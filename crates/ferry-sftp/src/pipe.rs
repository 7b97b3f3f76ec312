//! Commits sent without waiting (`PipelineStore::commit_nowait`): a worker sends
//! the `OPEN` of each small file of its batch as the file comes (gathered,
//! [`Batch`], and sent in one write before the thread waits); the rest of
//! each commit is moved on by the session's reader thread as the replies
//! come, with no other thread woken: the handle answered, the write,
//! `FSETSTAT` (fsync) and `CLOSE` go; the close answered (and every write
//! before it), the rename; the rename answered, the commit is over and
//! the worker, if it waits for it, is woken. The requests the reader
//! thread makes from the replies of one read go in one write.
//! SFTP handles are the server's to choose, so a file's write cannot be
//! sent before its open is answered: files are pipelined across one
//! another, not within one.
//!
//! What may block (waiting for writes a server answered out of order, a
//! rename where `posix-rename@openssh.com` is not offered) is handed back
//! to the worker that waits for the commit. A commit is over (and may be
//! reported) once its rename is confirmed; one that fails removes its
//! temporary before it says so; one given up (never waited for) goes no
//! further than removing its temporary.

use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::sync::mpsc::TryRecvError;
use std::sync::{Arc, Weak};
use std::thread::Thread;

use ferry_engine::entry::Meta;
use ferry_engine::store::MetaChange;

use crate::conn::{Batch, Conn, Out};
use crate::store::{replace_via, set_of};
use crate::wire::{self as w, Reply, Req, Set};
use crate::write::{open_req, FlightParts, Rx};

/// Content a thread holds for files whose open is not answered yet, at
/// most: past it, it waits for opens before it starts another commit.
const HELD_MAX: usize = 1 << 20;

/// A commit's state, shared by the worker that started it and the
/// session's reader thread that moves it on.
pub(crate) struct Shared(Mutex<State>);

struct State {
    temp: Vec<u8>,
    path: Vec<u8>,
    set: Set,
    fsync: bool,
    step: Step,
    /// The thread waiting, to wake once the commit is over (or, with
    /// `opened`, once its open is answered).
    waiter: Option<Thread>,
    opened: bool,
    /// Never to be waited for: no rename, the temporary removed.
    given_up: bool,
}

/// What a commit waits for.
enum Step {
    /// Its `OPEN` (content `data` to write once it is answered).
    Open(Vec<u8>),
    /// `left` replies of its writes, `FSETSTAT`, fsync and `CLOSE` (the
    /// first error among those come), and the replies of writes sent
    /// before the commit (a file streamed), which come before the close's.
    Close {
        left: usize,
        first: io::Result<()>,
        acks: VecDeque<Rx>,
    },
    /// Its rename.
    Rename,
    /// The removal of its temporary, then over with this error.
    Remove(io::Error),
    /// For the waiting worker: what would block the reader thread.
    Worker(Job),
    /// Nothing: over, with its result until it is taken.
    Done(Option<io::Result<()>>),
}

/// The blocking end of a commit, run by the worker that waits for it:
/// the writes' replies still missing waited for (first error so far), then
/// the rename (or the temporary removed).
struct Job(VecDeque<Rx>, io::Result<()>);

/// A commit started by [`start`], waited for by [`wait`]. Dropped
/// without being waited for, it is given up.
pub(crate) struct Started {
    s: Arc<Shared>,
    conn: Arc<Conn>,
    dir: Vec<u8>,
}

thread_local! {
    /// The commits this thread started and did not see opened, oldest first.
    static OPENING: RefCell<Vec<Weak<Shared>>> = const { RefCell::new(Vec::new()) };
    /// The requests this thread's commits made and did not send yet.
    static BATCH: RefCell<Batch> = RefCell::new(Batch::default());
}

/// Send the requests this thread gathered (also while it exits).
fn flush() {
    let _ = BATCH.try_with(|b| b.borrow_mut().flush());
}

/// Start committing `p` as `path` (given `meta`'s mode and mtime) with no
/// wait: its first requests go with this thread's next flush.
pub(crate) fn start(p: FlightParts, path: Vec<u8>, meta: &Meta, fsync: bool) -> Started {
    let conn = p.conn;
    let s = Arc::new(Shared(Mutex::new(State {
        temp: p.temp,
        path,
        set: set_of(meta, MetaChange::ALL),
        fsync: fsync && conn.ext.fsync,
        step: Step::Done(None),
        waiter: None,
        opened: false,
        given_up: false,
    })));
    {
        let mut g = s.0.lock();
        let step = BATCH.with(|b| {
            let b = &mut b.borrow_mut();
            match p.open {
                Err(data) => {
                    let req = open_req(&g.temp, w::F_CREAT | w::F_EXCL);
                    match conn.start_flight_in(b, req, &s) {
                        Ok(()) => Step::Open(data),
                        Err(e) => Step::Done(Some(Err(e))),
                    }
                }
                Ok((h, acks)) => {
                    let reqs = g.ends(&h);
                    let n = reqs.len();
                    let mut sent = Ok(());
                    for req in reqs {
                        if let Err(e) = conn.start_flight_in(b, req, &s) {
                            sent = Err(e);
                            break;
                        }
                    }
                    match sent {
                        Ok(()) => Step::Close {
                            left: n,
                            first: Ok(()),
                            acks,
                        },
                        // The session is gone: its requests fail.
                        Err(e) => Step::Done(Some(Err(e))),
                    }
                }
            }
        });
        g.step = step;
    }
    if matches!(s.0.lock().step, Step::Open(_)) {
        OPENING.with(|v| v.borrow_mut().push(Arc::downgrade(&s)));
    }
    // Memory stays bounded: a thread holds little content unsent.
    while let Some(oldest) = over_held() {
        flush();
        let mut g = oldest.0.lock();
        while matches!(g.step, Step::Open(_)) {
            g.waiter = Some(std::thread::current());
            g.opened = true;
            drop(g);
            std::thread::park();
            g = oldest.0.lock();
        }
    }
    Started {
        s,
        conn,
        dir: p.dir,
    }
}

/// This thread's oldest commit not opened yet, when the content its
/// commits not opened hold is past [`HELD_MAX`].
fn over_held() -> Option<Arc<Shared>> {
    OPENING.with(|v| {
        let mut v = v.borrow_mut();
        let mut held = 0;
        v.retain(|f| {
            let Some(f) = f.upgrade() else {
                return false;
            };
            let g = f.0.lock();
            match &g.step {
                Step::Open(d) => {
                    held += d.len();
                    true
                }
                _ => false,
            }
        });
        (held > HELD_MAX)
            .then(|| v.first().and_then(Weak::upgrade))
            .flatten()
    })
}

/// The result of commit `f`, once it is over.
pub(crate) fn wait(f: Started) -> io::Result<()> {
    flush();
    let mut g = f.s.0.lock();
    loop {
        match std::mem::replace(&mut g.step, Step::Done(None)) {
            Step::Done(r) => {
                return r.unwrap_or_else(|| Err(io::Error::other("SFTP commit waited for twice")))
            }
            Step::Worker(Job(acks, first)) => {
                let (temp, path) = (g.temp.clone(), g.path.clone());
                drop(g);
                return finish(&f.conn, &f.dir, &temp, &path, acks, first);
            }
            step => {
                g.step = step;
                g.waiter = Some(std::thread::current());
                g.opened = false;
                drop(g);
                std::thread::park();
                g = f.s.0.lock();
            }
        }
    }
}

/// The blocking end of a commit ([`Job`]).
fn finish(
    conn: &Conn,
    dir: &[u8],
    temp: &[u8],
    path: &[u8],
    acks: VecDeque<Rx>,
    first: io::Result<()>,
) -> io::Result<()> {
    let mut res = first;
    for rx in acks {
        let r = conn.wait(&rx).and_then(|r| r.ok());
        res = res.and(r);
    }
    let res = res.and_then(|()| replace_via(conn, dir, temp, path));
    if res.is_err() {
        let _ = conn.call(Req::path(w::REMOVE, temp)).and_then(|r| r.ok());
    }
    res
}

impl Drop for Started {
    /// A commit given up before it was over (never waited for): it goes
    /// no further than removing its temporary (a reserved name the next
    /// run removes if this does not arrive).
    fn drop(&mut self) {
        let mut g = self.s.0.lock();
        match std::mem::replace(&mut g.step, Step::Done(None)) {
            Step::Done(r) => g.step = Step::Done(r),
            Step::Worker(Job(acks, _)) => {
                drop(acks);
                flush();
                self.conn.send(Req::path(w::REMOVE, &g.temp));
            }
            step => {
                g.step = step;
                g.given_up = true;
                // (Its requests gathered go: their replies move it on.)
                drop(g);
                flush();
            }
        }
    }
}

/// Reply `r` to commit `f`, in the session's reader thread: its next
/// requests into `out`.
pub(crate) fn on_reply(f: &Arc<Shared>, r: io::Result<Reply>, out: &mut Out<'_>) {
    let mut g = f.0.lock();
    let step = std::mem::replace(&mut g.step, Step::Done(None));
    let was_open = matches!(step, Step::Open(_));
    let (next, moved) = match step {
        Step::Open(data) => match r.and_then(|r| r.handle()) {
            Ok(h) if g.given_up => {
                out.send(Req::path(w::CLOSE, &h));
                (g.fail(f, io::Error::other("given up"), out), true)
            }
            Ok(h) => (g.write(f, &h, &data, out), true),
            // Nothing was made.
            Err(e) => (Step::Done(Some(Err(e))), true),
        },
        Step::Close {
            left,
            first,
            mut acks,
        } => {
            let first = first.and(r.and_then(|r| r.ok()));
            if left > 1 {
                (
                    Step::Close {
                        left: left - 1,
                        first,
                        acks,
                    },
                    false,
                )
            } else {
                // The writes sent before the commit: answered before the
                // close by a server that answers in order.
                let mut first = first;
                while let Some(rx) = acks.front() {
                    match rx.try_recv() {
                        Ok(r) => first = first.and(r.and_then(|r| r.ok())),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            first = first.and(Err(io::Error::other("SFTP session lost")))
                        }
                    }
                    acks.pop_front();
                }
                (g.closed(f, first, acks, out), true)
            }
        }
        Step::Rename => match r.and_then(|r| r.ok()) {
            Ok(()) => (Step::Done(Some(Ok(()))), true),
            Err(e) => (g.fail(f, e, out), true),
        },
        Step::Remove(e) => (Step::Done(Some(Err(e))), true),
        // A reply for a commit over (a session lost once it was): kept as is.
        other => (other, false),
    };
    // The waiting thread woken only for what it waits for.
    let over = matches!(next, Step::Done(_) | Step::Worker(_));
    let wake = moved && (over || (g.opened && was_open));
    g.step = next;
    let waiter = if wake { g.waiter.take() } else { None };
    drop(g);
    if let Some(t) = waiter {
        t.unpark();
    }
}

impl State {
    /// The requests that end a file open as `h`: mode and mtime, fsync
    /// where asked, close.
    fn ends(&self, h: &[u8]) -> Vec<Req> {
        let mut reqs = vec![Req::path(w::FSETSTAT, h).attrs(&self.set)];
        if self.fsync {
            reqs.push(Req::ext("fsync@openssh.com").str(h));
        }
        reqs.push(Req::path(w::CLOSE, h));
        reqs
    }

    /// Content `data` to the file open as `h`, then its end ([`State::ends`]).
    fn write(&mut self, f: &Arc<Shared>, h: &[u8], data: &[u8], out: &mut Out<'_>) -> Step {
        let chunk = out.chunk();
        let mut reqs: Vec<Req> = data
            .chunks(chunk)
            .enumerate()
            .map(|(i, part)| Req::path(w::WRITE, h).u64((i * chunk) as u64).str(part))
            .collect();
        reqs.extend(self.ends(h));
        let left = reqs.len();
        for req in reqs {
            if let Err(e) = out.start(req, f) {
                // The session is gone: the temporary stays, a reserved
                // name the next run removes.
                return Step::Done(Some(Err(e)));
            }
        }
        Step::Close {
            left,
            first: Ok(()),
            acks: VecDeque::new(),
        }
    }

    /// Every reply of the file's end come (`first`: the first error), but
    /// those of `acks`: the rename, or the worker's.
    fn closed(
        &mut self,
        f: &Arc<Shared>,
        first: io::Result<()>,
        acks: VecDeque<Rx>,
        out: &mut Out<'_>,
    ) -> Step {
        if !acks.is_empty() {
            return Step::Worker(Job(acks, first));
        }
        match first {
            Err(e) => self.fail(f, e, out),
            Ok(()) if self.given_up => self.fail(f, io::Error::other("given up"), out),
            Ok(()) if out.ext().posix_rename => {
                let req = Req::ext("posix-rename@openssh.com")
                    .str(&self.temp)
                    .str(&self.path);
                match out.start(req, f) {
                    Ok(()) => Step::Rename,
                    Err(e) => Step::Done(Some(Err(e))),
                }
            }
            // A rename that cannot replace: the several requests of the
            // replacing one, waited for by the worker.
            Ok(()) => Step::Worker(Job(VecDeque::new(), Ok(()))),
        }
    }

    /// Over with error `e`, once the temporary is removed.
    fn fail(&mut self, f: &Arc<Shared>, e: io::Error, out: &mut Out<'_>) -> Step {
        match out.start(Req::path(w::REMOVE, &self.temp), f) {
            Ok(()) => Step::Remove(e),
            Err(_) => Step::Done(Some(Err(e))),
        }
    }
}
