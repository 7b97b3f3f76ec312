//! A big file's ranged upload over several sessions: what its threads
//! share, each range's writes answered, and the partial made durable and
//! recorded as ranges are done (no thread waits for the disk).

use super::*;

/// The step of a ranged upload's durability in flight (with its reply's
/// receiver): the partial's `fsync@openssh.com` and the record's rewrite
/// after it go over the first session while every session keeps
/// streaming (moved on by whichever thread takes an ack: no thread waits
/// for the disk).
pub(super) enum Durable {
    /// The partial's fsync asked, after every write of these ranges was
    /// answered (they are what it makes durable).
    Flushing(RangeSet),
    /// The record being opened (first time), to say these ranges.
    Opening(RangeSet),
    /// The record's rewrite.
    Recording,
}

/// A ranged upload's shared state.
pub(super) struct Track {
    /// Ranges whose every write was answered.
    pub(super) done: RangeSet,
    /// Bytes done since the last record was started, and when it was
    /// (the upload's start at first).
    pub(super) since: u64,
    pub(super) last: Instant,
    pub(super) sync: Option<(Rx, Durable)>,
    /// The record, open on the first session once first written.
    pub(super) rec: Option<Vec<u8>>,
}

/// What a ranged upload's threads share, fixed.
pub(super) struct Ranged<'a> {
    pub(super) conn: &'a Conn,
    /// The partial's handle on `conn`.
    pub(super) h0: &'a [u8],
    pub(super) record: &'a [u8],
    pub(super) ident: &'a str,
    pub(super) size: u64,
    pub(super) track: Mutex<Track>,
}

impl Ranged<'_> {
    /// Range `r` all written: counted, and the partial's fsync started
    /// when enough came since the last (not in the last stretch: the
    /// commit follows).
    pub(super) fn finished(&self, r: (u64, u64)) -> io::Result<()> {
        let mut t = self.track.lock();
        t.done.insert(r.0, r.1);
        t.since += r.1 - r.0;
        self.step(&mut t)
    }

    /// Move the record's fsync and rewrite on as far as their replies
    /// allow, without waiting.
    pub(super) fn step(&self, t: &mut Track) -> io::Result<()> {
        let c = self.conn;
        loop {
            let Some((rx, step)) = t.sync.take() else {
                let left = self.size - t.done.total();
                // The first record goes as soon as a range is done (its
                // fsync then has little to write back): a push killed a
                // moment later resumes from it. The next ones every
                // SYNC_EVERY and SYNC_INTERVAL.
                let first = t.rec.is_none() && t.since >= RANGE && left >= RANGE;
                if !first
                    && (t.since < SYNC_EVERY
                        || t.last.elapsed() < SYNC_INTERVAL
                        || left < SYNC_EVERY / 2)
                {
                    return Ok(());
                }
                t.since = 0;
                t.last = Instant::now();
                let snap = t.done.clone();
                t.sync = Some(if c.ext.fsync {
                    let rx = c.start(Req::ext("fsync@openssh.com").str(self.h0))?;
                    (rx, Durable::Flushing(snap))
                } else {
                    self.record_start(t, snap)?
                });
                continue;
            };
            let Some(reply) = c.poll(&rx) else {
                t.sync = Some((rx, step));
                return Ok(());
            };
            let reply = reply?;
            t.sync = match step {
                Durable::Flushing(snap) => {
                    reply.ok()?;
                    Some(self.record_start(t, snap)?)
                }
                Durable::Opening(snap) => {
                    t.rec = Some(reply.handle()?);
                    Some(self.record_start(t, snap)?)
                }
                Durable::Recording => {
                    reply.ok()?;
                    None
                }
            };
        }
    }

    /// The record's rewrite to say `snap` (durable): one write over the
    /// old text (its end line tells where it stops; a shorter text leaves
    /// the old one's tail after it, never read), once the record is open.
    pub(super) fn record_start(&self, t: &mut Track, snap: RangeSet) -> io::Result<(Rx, Durable)> {
        let c = self.conn;
        Ok(match &t.rec {
            None => (
                c.start(open_req(self.record, w::F_CREAT))?,
                Durable::Opening(snap),
            ),
            Some(h) => {
                let text = record_text(self.ident, &snap);
                (write_req(c, h, 0, &text)?, Durable::Recording)
            }
        })
    }

    /// After a failure: what is done made durable and recorded, waited
    /// for (the next run resumes from it).
    pub(super) fn keep(&self) {
        let mut t = self.track.lock();
        let c = self.conn;
        if let Some((rx, step)) = t.sync.take() {
            let reply = c.wait(&rx);
            if let (Durable::Opening(_), Ok(h)) = (step, reply.and_then(|r| r.handle())) {
                t.rec = Some(h);
            }
        }
        if c.ext.fsync
            && c.call(Req::ext("fsync@openssh.com").str(self.h0))
                .and_then(|r| r.ok())
                .is_err()
        {
            return;
        }
        let text = record_text(self.ident, &t.done);
        match &t.rec {
            Some(h) => {
                let _ = write_req(c, h, 0, &text).and_then(|rx| c.wait(&rx)?.ok());
            }
            None => {
                let _ = write_small(c, self.record, &text);
            }
        }
    }

    /// The record's handle closed (its last rewrite, if still in flight,
    /// is not waited for: the commit removes the record).
    pub(super) fn close(&self) {
        let t = self.track.lock();
        if let Some(h) = &t.rec {
            self.conn.send(Req::path(w::CLOSE, h));
        }
    }

    /// The ranges `todo` hands out, sent over `c` to its handle `h` of
    /// the partial: [`RANGED_AHEAD`] writes in flight all along (the
    /// next range's go while the last of one are answered).
    pub(super) fn send(
        &self,
        c: &Conn,
        h: &[u8],
        fd: BorrowedFd<'_>,
        mut take: impl FnMut() -> Option<(u64, u64)>,
        progress: Option<&Progress<'_>>,
        limit: Option<&Limiter>,
    ) -> io::Result<()> {
        // Each write's reply, and the range it is the last write of.
        let mut acks: VecDeque<(Rx, Option<(u64, u64)>)> = VecDeque::new();
        let mut cur: Option<(u64, (u64, u64))> = None;
        let chunk = c.chunk as usize;
        let ack = |acks: &mut VecDeque<(Rx, Option<(u64, u64)>)>| -> io::Result<()> {
            let (rx, last) = acks.pop_front().expect("in flight");
            c.wait(&rx)?.ok()?;
            match last {
                Some(r) => self.finished(r),
                None => {
                    // A reply may have come for the durability step in flight.
                    let mut t = self.track.lock();
                    if t.sync.is_some() {
                        self.step(&mut t)
                    } else {
                        Ok(())
                    }
                }
            }
        };
        let res = (|| {
            loop {
                let (at, r) = match cur {
                    Some(x) => x,
                    None => match take() {
                        Some(r) => (r.0, r),
                        None => break,
                    },
                };
                let want = ((r.1 - at) as usize).min(chunk);
                let (req, n) = write_from_fd(h, fd, at, want)?;
                if n == 0 {
                    return Err(io::Error::other("the file changed while it was copied"));
                }
                let end = at + n as u64;
                let last = end == r.1;
                acks.push_back((c.start(req)?, last.then_some(r)));
                cur = (!last).then_some((end, r));
                if acks.len() >= RANGED_AHEAD {
                    ack(&mut acks)?;
                }
                if let Some(l) = limit {
                    l.acquire(n as u64);
                }
                if let Some(p) = progress {
                    p.add(n as u64);
                }
            }
            while !acks.is_empty() {
                ack(&mut acks)?;
            }
            Ok(())
        })();
        if res.is_err() {
            let _ = drain(c, &mut acks.drain(..).map(|(rx, _)| rx).collect());
        }
        res
    }
}
