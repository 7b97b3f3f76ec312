//! The watch's loop ([`crate::watch_with`]): its state between runs
//! ([`Loop`]), what each message does to it, the retries, rescans and
//! polls due, and what a run's outcome sets for the next.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::{retry, Change, Config, Msg, Outcome, Pending, Status, Target, Work};

/// A path failing: retries made (0: none yet) and when the next is due
/// (`None`: in the run under way).
type Retries = HashMap<Vec<u8>, (u32, Option<Instant>)>;

/// What the loop keeps from one message or run to the next.
pub(crate) struct Loop<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) status: &'a Status,
    pub(crate) note: &'a dyn Fn(&str),
    pub(crate) pending: Pending,
    pub(crate) stop: bool,
    /// Sides of sources that are polled now.
    pub(crate) polled: Vec<usize>,
    pub(crate) next_poll: Option<Instant>,
    /// When the next changes of a side reached the kernel (Msg::Arrived).
    arrived: Vec<(usize, Instant, usize)>,
    /// Notes said once (by key).
    said: Vec<&'static str>,
    retries: Retries,
    /// A run that failed as a whole (not refused): a full run is retried
    /// with backoff, until one goes through.
    whole: Option<(u32, Option<Instant>)>,
    /// The failure said last (a retry's or rescan's same failure is not
    /// said again).
    said_failed: Option<String>,
    next_rescan: Option<Instant>,
}

impl<'a> Loop<'a> {
    pub(crate) fn new(cfg: &'a Config, status: &'a Status, note: &'a dyn Fn(&str)) -> Self {
        Loop {
            cfg,
            status,
            note,
            pending: Pending::default(),
            stop: false,
            polled: Vec::new(),
            next_poll: None,
            arrived: Vec::new(),
            said: Vec::new(),
            retries: HashMap::new(),
            whole: None,
            said_failed: None,
            next_rescan: cfg.rescan.map(|r| Instant::now() + r),
        }
    }

    /// The exit code: 1 while an entry is failing (not a run refused or
    /// failed as a whole, nor the root's own failure such as removals
    /// stopped: nothing of an entry is left unsaid then).
    pub(crate) fn code(&self) -> u8 {
        u8::from(self.retries.keys().any(|p| !p.is_empty()))
    }

    /// A poll timer while a side is polled: always (`cfg.poll`), or while
    /// a source cannot notify.
    fn interval(&self) -> Option<Duration> {
        self.cfg
            .poll
            .or((!self.polled.is_empty()).then_some(self.cfg.degraded_poll))
    }

    /// Take one message.
    pub(crate) fn take(&mut self, m: Msg) {
        match m {
            Msg::Changes(cs) => {
                let side = cs.first().map(Change::side);
                let now = match self.arrived.iter().position(|a| Some(a.0) == side) {
                    Some(i) => {
                        let (_, t, n) = self.arrived.swap_remove(i);
                        self.status.gauges().taken(n);
                        t
                    }
                    None => Instant::now(),
                };
                let (said, note) = (&mut self.said, self.note);
                let mut say = |key: &'static str, msg: String| {
                    if !said.contains(&key) {
                        said.push(key);
                        note(&format!("note: {msg}"));
                    }
                };
                for c in cs {
                    self.status.change(&c);
                    self.pending.add(c, now, &mut say);
                }
            }
            Msg::Arrived(side, t, n) => self.arrived.push((side, t, n)),
            Msg::Note(n) => (self.note)(&format!("note: {n}")),
            Msg::Stop => {
                self.status.stopping();
                self.stop = true
            }
            Msg::Polled(side, true) => {
                if !self.polled.contains(&side) {
                    self.polled.push(side);
                }
                if self.next_poll.is_none() {
                    let every = self.cfg.poll.unwrap_or(self.cfg.degraded_poll);
                    self.next_poll = Some(Instant::now() + every);
                }
            }
            Msg::Polled(side, false) => {
                self.polled.retain(|&s| s != side);
                self.pending.set_full(Instant::now());
            }
        }
    }

    /// Retries and rescans due join what is pending.
    pub(crate) fn due(&mut self, now: Instant) {
        for (p, r) in self.retries.iter_mut() {
            if r.1.is_some_and(|t| now >= t) {
                r.1 = None;
                self.pending.retry(p.clone(), now);
            }
        }
        if let Some((_, t)) = &mut self.whole {
            if t.is_some_and(|t| now >= t) {
                *t = None;
                self.pending.set_full(now);
            }
        }
        if self.next_rescan.is_some_and(|t| now >= t) {
            self.next_rescan = None;
            self.pending.set_full(now);
        }
    }

    /// Run `work` (changes seen since `since`) and set what follows.
    pub(crate) fn run(&mut self, target: &mut dyn Target, work: Work, since: Instant) {
        let prompted = std::mem::take(&mut self.pending.prompted);
        self.status.run_started(&work, self.pending.items.len());
        let out = target.run(&work);
        let now = Instant::now();
        self.failed_or_not(&work, &out, prompted, now);
        self.pending.swallowed.clear();
        self.failing(&out, now);
        // A scoped run that failed for some entry (a directory that
        // vanished or changed type while it ran) may have left part of
        // its changes undone: a full run follows at once (a full run's
        // failures, and a retry's, are retried with backoff, never at
        // once).
        if !work.full && out.errors > 0 && prompted {
            self.pending.set_full(now);
        }
        if self.next_rescan.is_none() || (work.full && out.failed.is_none()) {
            self.next_rescan = self.cfg.rescan.map(|r| now + r);
        }
        self.status
            .run_done(since.elapsed(), &out, self.pending.items.len());
        self.next_poll = self.interval().map(|p| now + p);
    }

    /// A run that failed or was refused as a whole: said (once while it
    /// stays the same), retried with backoff unless refused.
    fn failed_or_not(&mut self, work: &Work, out: &Outcome, prompted: bool, now: Instant) {
        match &out.failed {
            Some(f) => {
                if prompted || self.said_failed.as_ref() != Some(f) {
                    (self.note)(f);
                }
                self.said_failed = Some(f.clone());
                if out.refused {
                    // Refused again until something changes there: a
                    // full run refused gives back what it swallowed,
                    // a scoped one sets no full run.
                    if work.full {
                        self.pending.give_back();
                    }
                } else {
                    // An unreachable side, a root that cannot be read:
                    // a full run follows at once (a scoped run may have
                    // left part of its changes undone), then is
                    // retried with backoff while it fails.
                    let tries = self.whole.map_or(0, |w| w.0 + 1);
                    let at = match tries {
                        0 => now,
                        t => now + retry::backoff(t - 1),
                    };
                    self.whole = Some((tries, Some(at)));
                }
            }
            None => {
                if self.said_failed.take().is_some() {
                    (self.note)("note: runs go through again");
                }
                if work.full {
                    self.whole = None;
                }
            }
        }
    }

    /// The paths a run healed (said once) and those failing (retried with
    /// backoff).
    fn failing(&mut self, out: &Outcome, now: Instant) {
        for p in &out.healed {
            if self.retries.remove(p).is_some() {
                let p = if p.is_empty() { &b"."[..] } else { p };
                (self.note)(&format!(
                    "note: {}: healed (synced on a retry)",
                    String::from_utf8_lossy(p)
                ));
            }
        }
        for p in &out.failing {
            let new = !self.retries.contains_key(p);
            let r = self.retries.entry(p.clone()).or_insert((0, None));
            if r.1.is_none() {
                r.0 += 1;
            }
            r.1 = Some(now + retry::backoff(r.0 - 1));
            // The root's own failure (removals stopped) left its
            // removals: a full run at once (held while removals go
            // on), then retries with backoff.
            if new && p.is_empty() {
                self.pending.set_full(now);
            }
        }
        // Retries the run did not settle (it did not cover them).
        for r in self.retries.values_mut() {
            if r.1.is_none() {
                r.1 = Some(now + retry::backoff(r.0.saturating_sub(1)));
            }
        }
    }

    /// Wait for the next message or timer; `Some(code)`: the loop ends.
    pub(crate) fn wait(&mut self, rx: &Receiver<Msg>) -> Option<u8> {
        self.status.queue(self.pending.items.len());
        let timers = [
            self.pending.deadline(self.cfg.settle),
            self.next_poll,
            self.retries.values().filter_map(|r| r.1).min(),
            self.whole.and_then(|w| w.1),
            self.next_rescan,
        ];
        let deadline = timers.into_iter().flatten().min();
        let msg = match deadline {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
        };
        match msg {
            Ok(m) => self.take(m),
            Err(RecvTimeoutError::Timeout) => {
                if self.next_poll.is_some_and(|p| Instant::now() >= p) {
                    self.next_poll = None;
                    self.pending.set_full(Instant::now());
                }
            }
            Err(RecvTimeoutError::Disconnected) => return Some(self.code()),
        }
        None
    }
}
