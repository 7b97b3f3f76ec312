//! Commits sent without waiting (`Store::commit_nowait`): a worker sends
//! the `OPEN` of each small file of its batch as the file comes, and each
//! file's next requests as soon as the reply they need is there (the
//! handle: the write, `FSETSTAT` and `CLOSE`; the close: the rename), so
//! that a batch costs about three round trips in all, not three per file.
//! SFTP handles are the server's to choose, so a file's write cannot be
//! sent before its open is answered: files are pipelined across one
//! another, not within one.
//!
//! The commits a thread started are driven together by whichever of them
//! it waits for: every reply already there moves its commit on, else the
//! thread blocks on the oldest request still unanswered. The requests a
//! thread makes meanwhile are gathered ([`Batch`]) and sent together
//! before it blocks: a batch's opens in one write, then the next steps
//! of all the files whose replies came. A commit is over
//! (and may be reported) once its rename is confirmed; one that fails
//! removes its temporary before it says so.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, Weak};

use ferry_engine::entry::Meta;
use ferry_engine::store::MetaChange;

use crate::conn::{Batch, Conn};
use crate::store::{replace_via, set_of};
use crate::wire::{self as w, Reply, Req, Set};
use crate::write::{open_req, FlightParts, Rx};

/// Content a thread holds for files whose open is not answered yet, at
/// most: past it, it waits for replies before it starts another commit.
const HELD_MAX: usize = 1 << 20;

/// What a commit waits for.
enum Step {
    /// Its `OPEN` (content `data` to write once it is answered).
    Open(Rx, Vec<u8>),
    /// Its writes, `FSETSTAT`, fsync and `CLOSE`, replies in this order;
    /// the first error among those come.
    Close(VecDeque<Rx>, io::Result<()>),
    /// Its rename.
    Rename(Rx),
    /// Nothing: over, with its result until it is taken.
    Done(Option<io::Result<()>>),
}

/// One commit in flight.
pub(crate) struct Flight {
    conn: Arc<Conn>,
    dir: Vec<u8>,
    temp: Vec<u8>,
    path: Vec<u8>,
    set: Set,
    fsync: bool,
    step: Step,
    /// When its step's requests were sent (this thread's count).
    sent: u64,
}

/// A commit started by [`start`], waited for by [`wait`].
pub(crate) type Started = Arc<Mutex<Flight>>;

thread_local! {
    /// The commits this thread started and did not see over, oldest first.
    static FLIGHTS: RefCell<Vec<Weak<Mutex<Flight>>>> = const { RefCell::new(Vec::new()) };
    static SENT: Cell<u64> = const { Cell::new(0) };
    /// The requests this thread's commits made and did not send yet.
    static BATCH: RefCell<Batch> = RefCell::new(Batch::default());
}

/// Start `req` on `conn` with this thread's other requests (sent by
/// [`flush`]).
fn gather(conn: &Arc<Conn>, req: Req) -> io::Result<Rx> {
    BATCH.with(|b| conn.start_in(&mut b.borrow_mut(), req))
}

/// Send the requests this thread gathered (also while it exits).
fn flush() {
    let _ = BATCH.try_with(|b| b.borrow_mut().flush());
}

fn tick() -> u64 {
    SENT.with(|c| {
        c.set(c.get() + 1);
        c.get()
    })
}

/// Start committing `p` as `path` (given `meta`'s mode and mtime) with no
/// wait: its first requests go now.
pub(crate) fn start(p: FlightParts, path: Vec<u8>, meta: &Meta, fsync: bool) -> Started {
    let mut f = Flight {
        conn: p.conn,
        dir: p.dir,
        temp: p.temp,
        path,
        set: set_of(meta, MetaChange::ALL),
        fsync,
        step: Step::Done(None),
        sent: tick(),
    };
    f.step = match p.open {
        Err(data) => match gather(&f.conn, open_req(&f.temp, w::F_CREAT | w::F_EXCL)) {
            Ok(rx) => Step::Open(rx, data),
            Err(e) => Step::Done(Some(Err(e))),
        },
        Ok((h, acks)) => f.close(&h, acks),
    };
    let f = Arc::new(Mutex::new(f));
    FLIGHTS.with(|v| v.borrow_mut().push(Arc::downgrade(&f)));
    // Memory stays bounded: a thread holds little content unsent.
    while held() > HELD_MAX {
        drive(None);
    }
    f
}

/// The result of commit `f`, once it is over (moving this thread's other
/// commits on meanwhile).
pub(crate) fn wait(f: &Started) -> io::Result<()> {
    loop {
        if let Step::Done(r) = &mut f.lock().unwrap().step {
            return r
                .take()
                .unwrap_or_else(|| Err(io::Error::other("SFTP commit waited for twice")));
        }
        drive(Some(f));
    }
}

/// Content held by this thread's commits not opened yet.
fn held() -> usize {
    live(None)
        .iter()
        .map(|f| match &f.lock().unwrap().step {
            Step::Open(_, d) => d.len(),
            _ => 0,
        })
        .sum()
}

/// This thread's commits not over (and `me`, started elsewhere).
fn live(me: Option<&Started>) -> Vec<Started> {
    let mut all: Vec<Started> = FLIGHTS.with(|v| {
        let mut v = v.borrow_mut();
        v.retain(|w| {
            w.upgrade()
                .is_some_and(|f| !matches!(f.lock().unwrap().step, Step::Done(_)))
        });
        v.iter().filter_map(Weak::upgrade).collect()
    });
    if let Some(me) = me {
        if !all.iter().any(|f| Arc::ptr_eq(f, me)) {
            all.push(me.clone());
        }
    }
    all
}

/// One move: every reply already there taken, or else the oldest
/// request still unanswered waited for.
fn drive(me: Option<&Started>) {
    let all = live(me);
    let mut moved = false;
    for f in &all {
        let mut g = f.lock().unwrap();
        while let Some(r) = g.rx().and_then(|rx| g.conn.poll(rx)) {
            g.advance(r);
            moved = true;
        }
    }
    if moved {
        return;
    }
    let oldest = all
        .iter()
        .filter(|f| !matches!(f.lock().unwrap().step, Step::Done(_)))
        .min_by_key(|f| f.lock().unwrap().sent);
    // Nothing to take: what was gathered goes before this thread blocks.
    flush();
    if let Some(f) = oldest {
        let mut g = f.lock().unwrap();
        if let Some(r) = g.rx().map(|rx| g.conn.wait(rx)) {
            g.advance(r);
        }
    }
}

impl Flight {
    /// The request whose reply comes next.
    fn rx(&self) -> Option<&Rx> {
        match &self.step {
            Step::Open(rx, _) | Step::Rename(rx) => Some(rx),
            Step::Close(acks, _) => acks.front(),
            Step::Done(_) => None,
        }
    }

    /// Take reply `r` of [`Flight::rx`]: the next step.
    fn advance(&mut self, r: io::Result<Reply>) {
        let step = std::mem::replace(&mut self.step, Step::Done(None));
        self.step = match step {
            Step::Open(_, data) => match r.and_then(|r| r.handle()) {
                Ok(h) => {
                    let mut acks = VecDeque::new();
                    let chunk = self.conn.chunk as usize;
                    let mut sent = Ok(());
                    for (i, part) in data.chunks(chunk).enumerate() {
                        let req = Req::path(w::WRITE, &h).u64((i * chunk) as u64).str(part);
                        match gather(&self.conn, req) {
                            Ok(rx) => acks.push_back(rx),
                            Err(e) => {
                                sent = Err(e);
                                break;
                            }
                        }
                    }
                    match sent {
                        Ok(()) => self.close(&h, acks),
                        Err(e) => self.fail(e),
                    }
                }
                // Nothing was made.
                Err(e) => Step::Done(Some(Err(e))),
            },
            Step::Close(mut acks, first) => {
                acks.pop_front();
                let first = first.and(r.and_then(|r| r.ok()));
                match (acks.is_empty(), first) {
                    (false, first) => Step::Close(acks, first),
                    (true, Err(e)) => self.fail(e),
                    (true, Ok(())) if self.conn.ext.posix_rename => {
                        let req = Req::ext("posix-rename@openssh.com")
                            .str(&self.temp)
                            .str(&self.path);
                        self.sent = tick();
                        match gather(&self.conn, req) {
                            Ok(rx) => Step::Rename(rx),
                            Err(e) => self.fail(e),
                        }
                    }
                    // A rename that cannot replace: the several requests
                    // of the replacing one, waited for here.
                    (true, Ok(())) => {
                        flush();
                        match replace_via(&self.conn, &self.dir, &self.temp, &self.path) {
                            Ok(()) => Step::Done(Some(Ok(()))),
                            Err(e) => self.fail(e),
                        }
                    }
                }
            }
            Step::Rename(_) => match r.and_then(|r| r.ok()) {
                Ok(()) => Step::Done(Some(Ok(()))),
                Err(e) => self.fail(e),
            },
            done @ Step::Done(_) => done,
        };
    }

    /// Send the end of the file open as `h` (its writes `acks` in flight):
    /// mode and mtime, fsync where asked, close.
    fn close(&mut self, h: &[u8], mut acks: VecDeque<Rx>) -> Step {
        self.sent = tick();
        let mut reqs = vec![Req::path(w::FSETSTAT, h).attrs(&self.set)];
        if self.fsync && self.conn.ext.fsync {
            reqs.push(Req::ext("fsync@openssh.com").str(h));
        }
        reqs.push(Req::path(w::CLOSE, h));
        for req in reqs {
            match gather(&self.conn, req) {
                Ok(rx) => acks.push_back(rx),
                Err(e) => {
                    flush();
                    self.conn.send(Req::path(w::CLOSE, h));
                    return self.fail(e);
                }
            }
        }
        Step::Close(acks, Ok(()))
    }

    /// Over with error `e`, once the temporary is removed.
    fn fail(&mut self, e: io::Error) -> Step {
        flush();
        let _ = self
            .conn
            .call(Req::path(w::REMOVE, &self.temp))
            .and_then(|r| r.ok());
        Step::Done(Some(Err(e)))
    }
}

impl Drop for Flight {
    /// A commit given up before it was over (never waited for): its
    /// temporary goes (after its open, on the same session; a reserved
    /// name the next run removes if this does not arrive).
    fn drop(&mut self) {
        if !matches!(self.step, Step::Done(_)) {
            // (After its open, if this thread gathered it.)
            flush();
            self.conn.send(Req::path(w::REMOVE, &self.temp));
        }
    }
}
