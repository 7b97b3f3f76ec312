use super::*;

fn collect(p: &mut Pending, cs: Vec<Change>, now: Instant) -> Vec<String> {
    let mut notes = Vec::new();
    for c in cs {
        p.add(c, now, &mut |k, _| notes.push(k.to_string()));
    }
    notes
}

fn dirs(w: &Work) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = w
        .scope
        .dirs
        .iter()
        .map(|(d, deep)| (String::from_utf8_lossy(d).into_owned(), *deep))
        .collect();
    v.sort();
    v
}

#[test]
fn a_written_file_waits_for_its_close_or_for_quiet() {
    let settle = Duration::from_millis(100);
    let t0 = Instant::now();
    let mut p = Pending::default();
    collect(&mut p, vec![Change::Entry(0, b"a/f".to_vec(), false)], t0);
    assert!(p.take(t0, settle).is_none());
    assert_eq!(p.deadline(settle), Some(t0 + settle));
    // Written again later: the quiet time starts over.
    let t1 = t0 + Duration::from_millis(80);
    collect(&mut p, vec![Change::Entry(0, b"a/f".to_vec(), false)], t1);
    assert!(p.take(t0 + settle, settle).is_none());
    let (w, since) = p.take(t1 + settle, settle).expect("quiet");
    assert_eq!(since, t0);
    assert_eq!(dirs(&w), vec![("a".into(), false)]);
    // Closed: at once.
    collect(
        &mut p,
        vec![
            Change::Entry(0, b"g".to_vec(), false),
            Change::Entry(0, b"g".to_vec(), true),
        ],
        t1,
    );
    let (w, _) = p.take(t1, settle).expect("closed");
    assert_eq!(dirs(&w), vec![("".into(), false)]);
    assert!(p.items.is_empty() && p.deadline(settle).is_none());
}

#[test]
fn a_file_written_all_the_time_is_still_taken() {
    let settle = Duration::from_millis(100);
    let t0 = Instant::now();
    let mut p = Pending::default();
    let mut t = t0;
    while t < t0 + max_wait(settle) {
        collect(&mut p, vec![Change::Entry(0, b"log".to_vec(), false)], t);
        assert!(p.take(t, settle).is_none());
        t += Duration::from_millis(50);
    }
    assert!(p.take(t, settle).is_some());
}

#[test]
fn a_directory_rename_moves_what_is_pending_inside() {
    let settle = Duration::from_millis(100);
    let t0 = Instant::now();
    let mut p = Pending::default();
    collect(
        &mut p,
        vec![
            Change::Entry(0, b"d/x/f".to_vec(), false),
            Change::Rename(0, b"d/x".to_vec(), b"e/y".to_vec(), true),
            Change::Deep(0, b"n".to_vec()),
            Change::Dir(0, b"m".to_vec()),
        ],
        t0,
    );
    let (w, _) = p.take(t0, settle).expect("ready");
    assert_eq!(w.renames, vec![(b"d/x".to_vec(), b"e/y".to_vec(), true)]);
    assert_eq!(
        dirs(&w),
        vec![
            ("d".into(), false),
            ("e".into(), false),
            ("m".into(), false),
            ("n".into(), true)
        ]
    );
    // The file written inside, now under its new name, still waits.
    assert!(p.items.contains_key(&(0, b"e/y/f".to_vec())));
}

#[test]
fn overflow_and_roots_say_so_once_and_compare_everything() {
    let settle = Duration::from_millis(100);
    let t0 = Instant::now();
    let mut p = Pending::default();
    let n = collect(
        &mut p,
        vec![Change::Entry(0, b"f".to_vec(), true), Change::Overflow(0)],
        t0,
    );
    assert_eq!(n, vec!["overflow".to_string()]);
    let (w, _) = p.take(t0, settle).expect("full");
    assert!(w.full && p.items.is_empty());
    collect(
        &mut p,
        vec![Change::Gone(0), Change::Entry(0, b"f".to_vec(), true)],
        t0,
    );
    assert!(
        p.take(t0, settle).is_none(),
        "nothing runs while a root is gone"
    );
    assert!(p.deadline(settle).is_none(), "and no timer runs");
    collect(&mut p, vec![Change::Back(0)], t0);
    assert!(p.take(t0, settle).expect("back").0.full);
}

/// Removals hold every run, full or scoped, until they have been quiet for
/// `settle`: an `rm -rf` of the root is seen as the root gone (nothing
/// runs while it is) before a run could mirror the removals inside it.
#[test]
fn removals_hold_every_run_until_they_are_quiet() {
    let settle = Duration::from_millis(100);
    let q = removal_quiet(settle);
    let t0 = Instant::now();
    let mut p = Pending::default();
    collect(
        &mut p,
        vec![
            Change::Entry(0, b"w".to_vec(), true),
            Change::Removed(0, b"a/f".to_vec()),
            Change::Overflow(0),
        ],
        t0,
    );
    assert!(p.take(t0, settle).is_none(), "held: nothing runs");
    assert!(
        p.take(t0 + settle, settle).is_none(),
        "held longer than settle"
    );
    let t1 = t0 + q / 2;
    collect(&mut p, vec![Change::Removed(0, b"a/g".to_vec())], t1);
    assert!(p.take(t0 + q, settle).is_none(), "a later removal holds on");
    // The root goes last: nothing runs while it is gone.
    collect(&mut p, vec![Change::Gone(0)], t1);
    assert!(p.take(t1 + q * 2, settle).is_none());
    collect(&mut p, vec![Change::Back(0)], t1);
    assert!(p.take(t1 + q * 2, settle).expect("back").0.full);
    // Removals quiet, root there: they run.
    collect(&mut p, vec![Change::Removed(0, b"b/h".to_vec())], t1);
    assert!(p.take(t1, settle).is_none());
    let (w, _) = p.take(t1 + q, settle).expect("quiet");
    assert_eq!(dirs(&w), vec![("b".into(), false)]);
}

/// Records each run's work for the test driving the loop.
struct Rec(std::sync::mpsc::Sender<Work>);

impl Target for Rec {
    fn run(&mut self, w: &Work) -> Outcome {
        let _ = self.0.send(w.clone());
        Outcome::default()
    }
}

/// A source driven by the test: `f` runs on its own thread with the
/// loop's sender.
struct Driven(Option<Drive>);

type Drive = Box<dyn FnOnce(usize, Sender<Msg>) + Send>;

impl Source for Driven {
    fn start(mut self: Box<Self>, side: usize, tx: Sender<Msg>) -> Result<(), NotWatched> {
        let f = self.0.take().expect("started once");
        std::thread::spawn(move || f(side, tx));
        Ok(())
    }
}

struct Refused;

impl Source for Refused {
    fn start(self: Box<Self>, _: usize, _: Sender<Msg>) -> Result<(), NotWatched> {
        Err(NotWatched(
            "host:path: the remote ferry cannot watch it".into(),
        ))
    }
}

fn cfg(poll: Option<Duration>) -> Config {
    Config {
        guard: None,
        guard_sides: Vec::new(),
        local: Vec::new(),
        poll,
        settle: Duration::from_millis(10),
        degraded_poll: Duration::from_millis(20),
        rescan: None,
    }
}

/// A source's changes are run as a local tree's; while it says it must
/// be polled the side is polled; once it notifies again one full run
/// follows and the poll timer stops (idle costs nothing again).
#[test]
fn a_source_notifies_or_is_polled_while_it_cannot() {
    let (wtx, wrx) = std::sync::mpsc::channel::<Work>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let drive = move |side: usize, tx: Sender<Msg>| {
        let check = || -> Result<(), String> {
            let next = || {
                wrx.recv_timeout(Duration::from_secs(10))
                    .map_err(|_| "no run".to_string())
            };
            if !next()?.full {
                return Err("the first run is full".into());
            }
            tx.send(Msg::Changes(vec![Change::Entry(
                side,
                b"a/f".to_vec(),
                true,
            )]))
            .unwrap();
            let w = next()?;
            if w.full || dirs(&w) != vec![("a".to_string(), false)] {
                return Err(format!("a scoped run of a: {w:?}"));
            }
            // Lost: polled (full runs with no change), again and again.
            tx.send(Msg::Polled(side, true)).unwrap();
            for _ in 0..3 {
                if !next()?.full {
                    return Err("a poll is a full run".into());
                }
            }
            // Back: one full run, then no timer.
            tx.send(Msg::Polled(side, false)).unwrap();
            // (A poll may have been due already: two at most.)
            let mut after = 0;
            while let Ok(w) = wrx.recv_timeout(Duration::from_millis(300)) {
                after += 1;
                if !w.full || after > 2 {
                    return Err(format!("still polled: {w:?}"));
                }
            }
            if after == 0 {
                return Err("no full run once it notifies again".into());
            }
            tx.send(Msg::Changes(vec![Change::Entry(side, b"b".to_vec(), true)]))
                .unwrap();
            let w = next()?;
            if w.full || dirs(&w) != vec![(String::new(), false)] {
                return Err(format!("a scoped run of the root: {w:?}"));
            }
            Ok(())
        };
        let r = check();
        let _ = tx.send(Msg::Stop);
        let _ = done_tx.send(r);
    };
    let status = Status::new("test");
    let src: Vec<Box<dyn Source>> = vec![Box::new(Driven(Some(Box::new(drive))))];
    let code = watch_with(&cfg(None), src, &mut Rec(wtx), &status, &|_| {});
    assert_eq!(code, 0);
    done_rx.recv().unwrap().unwrap();
}

/// A source that cannot start is polled, and a note says so.
#[test]
fn a_source_that_cannot_start_is_polled() {
    let (wtx, wrx) = std::sync::mpsc::channel::<Work>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<bool>();
    // Another source stops the loop once polls have come.
    let drive = move |_: usize, tx: Sender<Msg>| {
        let polled = (0..3).all(|_| {
            wrx.recv_timeout(Duration::from_secs(10))
                .is_ok_and(|w| w.full)
        });
        let _ = tx.send(Msg::Stop);
        let _ = done_tx.send(polled);
    };
    let notes = parking_lot::Mutex::new(Vec::new());
    let status = Status::new("test");
    let src: Vec<Box<dyn Source>> =
        vec![Box::new(Refused), Box::new(Driven(Some(Box::new(drive))))];
    let note = |n: &str| notes.lock().push(n.to_string());
    let code = watch_with(&cfg(None), src, &mut Rec(wtx), &status, &note);
    assert_eq!(code, 0);
    assert!(done_rx.recv().unwrap(), "polled");
    let notes = notes.into_inner();
    assert_eq!(
        notes,
        vec!["note: host:path: the remote ferry cannot watch it: polled every 20ms"]
    );
}

/// Answers each run with the next outcome given, and records the run.
struct Scripted(std::sync::mpsc::Sender<Work>, Vec<Outcome>);

impl Target for Scripted {
    fn run(&mut self, w: &Work) -> Outcome {
        let _ = self.0.send(w.clone());
        if self.1.is_empty() {
            Outcome::default()
        } else {
            self.1.remove(0)
        }
    }
}

/// A scoped run that failed is followed by a full run (it may have left
/// part of its changes undone); a refused one is not: the full run would
/// be refused too, and a later change elsewhere runs scoped and is done.
fn after_a_failed_scoped_run(refused: bool) -> Work {
    let (wtx, wrx) = std::sync::mpsc::channel::<Work>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Result<Work, String>>();
    let drive = move |side: usize, tx: Sender<Msg>| {
        let check = || -> Result<Work, String> {
            let next = || {
                wrx.recv_timeout(Duration::from_secs(60))
                    .map_err(|_| "no run".to_string())
            };
            next()?; // the first, full run
            tx.send(Msg::Changes(vec![Change::Entry(
                side,
                b"a/f".to_vec(),
                true,
            )]))
            .unwrap();
            let w = next()?;
            if w.full {
                return Err(format!("a scoped run of a: {w:?}"));
            }
            tx.send(Msg::Changes(vec![Change::Entry(
                side,
                b"c/f".to_vec(),
                true,
            )]))
            .unwrap();
            next()
        };
        let r = check();
        let _ = tx.send(Msg::Stop);
        let _ = done_tx.send(r);
    };
    let status = Status::new("test");
    let src: Vec<Box<dyn Source>> = vec![Box::new(Driven(Some(Box::new(drive))))];
    let failed = Outcome {
        failed: Some("refusing to delete 402 entries".into()),
        refused,
        ..Outcome::default()
    };
    let mut t = Scripted(wtx, vec![Outcome::default(), failed]);
    let code = watch_with(&cfg(None), src, &mut t, &status, &|_| {});
    assert_eq!(code, 0);
    done_rx.recv().unwrap().unwrap()
}

#[test]
fn a_refused_scoped_run_is_not_followed_by_a_full_run() {
    let w = after_a_failed_scoped_run(true);
    assert!(!w.full, "{w:?}");
    assert_eq!(dirs(&w), vec![("c".to_string(), false)]);
    assert!(after_a_failed_scoped_run(false).full);
}

/// Refuses every full run but the first, and every run of directory `a`.
struct Refuser(std::sync::mpsc::Sender<Work>, bool);

impl Target for Refuser {
    fn run(&mut self, w: &Work) -> Outcome {
        let _ = self.0.send(w.clone());
        let first = std::mem::replace(&mut self.1, false);
        let refused = (w.full && !first) || w.scope.dirs.iter().any(|d| d.0 == b"a");
        Outcome {
            refused,
            failed: refused.then(|| "refusing to delete 400 entries in DST".into()),
            ..Outcome::default()
        }
    }
}

/// A refused scoped run sets no full run (which would be refused again
/// and swallow later changes elsewhere); a refused full run gives back
/// the changes it swallowed, which run scoped; the refusal is said per
/// change, and is never retried alone.
#[test]
fn a_refused_run_neither_escalates_nor_swallows_other_changes() {
    let (wtx, wrx) = std::sync::mpsc::channel::<Work>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let drive = move |side: usize, tx: Sender<Msg>| {
        let check = || -> Result<(), String> {
            let next = || {
                wrx.recv_timeout(Duration::from_secs(10))
                    .map_err(|_| "no run".to_string())
            };
            let quiet = || match wrx.recv_timeout(Duration::from_millis(300)) {
                Ok(w) => Err(format!("an unasked run: {w:?}")),
                Err(_) => Ok(()),
            };
            next()?;
            let entry = |p: &[u8]| Change::Entry(side, p.to_vec(), true);
            tx.send(Msg::Changes(vec![entry(b"a/x")])).unwrap();
            let w = next()?;
            if w.full || dirs(&w) != vec![("a".to_string(), false)] {
                return Err(format!("a scoped run of a: {w:?}"));
            }
            quiet()?;
            tx.send(Msg::Changes(vec![entry(b"c/y")])).unwrap();
            let w = next()?;
            if w.full || dirs(&w) != vec![("c".to_string(), false)] {
                return Err(format!("a scoped run of c: {w:?}"));
            }
            // A full run (an overflow) swallows c/z, and is refused.
            tx.send(Msg::Changes(vec![Change::Overflow(side), entry(b"c/z")]))
                .unwrap();
            if !next()?.full {
                return Err("the overflow's full run".into());
            }
            let w = next()?;
            if w.full || dirs(&w) != vec![("c".to_string(), false)] {
                return Err(format!("c/z given back, scoped: {w:?}"));
            }
            quiet()
        };
        let r = check();
        let _ = tx.send(Msg::Stop);
        let _ = done_tx.send(r);
    };
    let notes = parking_lot::Mutex::new(Vec::new());
    let note = |n: &str| notes.lock().push(n.to_string());
    let status = Status::new("test");
    let src: Vec<Box<dyn Source>> = vec![Box::new(Driven(Some(Box::new(drive))))];
    let code = watch_with(&cfg(None), src, &mut Refuser(wtx, true), &status, &note);
    done_rx.recv().unwrap().unwrap();
    assert_eq!(code, 0, "a refusal is no failing entry");
    let notes = notes.into_inner();
    let refusals = notes.iter().filter(|n| n.starts_with("refusing")).count();
    assert_eq!(refusals, 2, "{notes:?}");
}

/// A path a run failed on is retried alone (its directory, or itself
/// whole), again and again with growing delays, until a run goes
/// through it; the exit code says whether one is still failing.
#[test]
fn a_failing_path_is_retried_until_it_heals() {
    struct Flaky(std::sync::mpsc::Sender<Work>, u32);
    impl Target for Flaky {
        fn run(&mut self, w: &Work) -> Outcome {
            let _ = self.0.send(w.clone());
            let covers = retry::covers(w, b"d/f");
            let mut out = Outcome::default();
            if covers && self.1 > 0 {
                self.1 -= 1;
                out.errors = 1;
                out.failing.push(b"d/f".to_vec());
            } else if covers {
                out.healed.push(b"d/f".to_vec());
            }
            out
        }
    }
    let (wtx, wrx) = std::sync::mpsc::channel::<Work>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let drive = move |_: usize, tx: Sender<Msg>| {
        let check = || -> Result<(), String> {
            // The first run fails, then two retries; the third heals.
            for i in 0..3 {
                let w = wrx
                    .recv_timeout(Duration::from_secs(30))
                    .map_err(|_| format!("no retry {i}"))?;
                if i > 0 && (w.full || dirs(&w) != vec![("d/f".to_string(), true)]) {
                    return Err(format!("a retry of d/f alone: {w:?}"));
                }
            }
            Ok(())
        };
        let r = check();
        // The retry that heals (its note is said before the loop reads
        // the stop).
        let healed = wrx.recv_timeout(Duration::from_secs(30)).is_ok();
        let _ = tx.send(Msg::Stop);
        let _ = done_tx.send(r.and_then(|()| healed.then_some(()).ok_or("no healing run".into())));
    };
    let notes = parking_lot::Mutex::new(Vec::new());
    let note = |n: &str| notes.lock().push(n.to_string());
    let status = Status::new("test");
    let src: Vec<Box<dyn Source>> = vec![Box::new(Driven(Some(Box::new(drive))))];
    let code = watch_with(&cfg(None), src, &mut Flaky(wtx, 3), &status, &note);
    done_rx.recv().unwrap().unwrap();
    assert_eq!(code, 0, "healed before the stop");
    let notes = notes.into_inner();
    assert_eq!(notes, vec!["note: d/f: healed (synced on a retry)"]);
}

/// A watched tree whose removals count in a guard (side 0), its thread
/// started, and `n` files in it; the thread has read a first removal.
fn counted_tree(
    n: usize,
) -> (
    tempfile::TempDir,
    std::sync::Arc<ferry_engine::Guard>,
    std::sync::mpsc::Receiver<Msg>,
) {
    let d = tempfile::tempdir().unwrap();
    for i in 0..=n {
        std::fs::write(d.path().join(format!("f{i}")), b"x").unwrap();
    }
    let g = std::sync::Arc::new(ferry_engine::Guard::default());
    let mut t = inotify::Tree::new(0, d.path(), Duration::from_secs(60)).unwrap();
    t.count_removals(g.clone(), 0);
    let (tx, rx) = channel();
    std::thread::spawn(move || t.run(tx));
    // The thread reads (its barrier is in place) once it has counted this.
    std::fs::remove_file(d.path().join(format!("f{n}"))).unwrap();
    let t0 = Instant::now();
    while g.removals(0) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no event read");
        std::thread::sleep(Duration::from_millis(1));
    }
    while rx.recv_timeout(Duration::from_millis(50)).is_ok() {}
    (d, g, rx)
}

/// A run checks, before each removal, that nothing was removed since it
/// began: the count it reads includes every removal made until then, not
/// only those the watcher's thread has read yet (a loaded machine delays
/// that thread while an `rm -rf` goes on and the run mirrors it).
#[test]
fn a_removal_is_counted_as_soon_as_it_is_made() {
    let (d, g, _rx) = counted_tree(200);
    for i in 0..200u64 {
        std::fs::remove_file(d.path().join(format!("f{i}"))).unwrap();
        // No wait: the thread may not have woken yet.
        assert_eq!(g.settled(0), i + 2, "removal {i} not counted");
    }
}

/// Every removal counted in what a run starts from (`Guard::mark`) has its
/// change among the messages the loop takes in next: a run taken then is
/// held by it; one counted later stops the run's removals.
#[test]
fn a_removal_marked_has_its_change_sent() {
    let (d, g, rx) = counted_tree(200);
    let mut sent = 1;
    for i in 0..200u64 {
        std::fs::remove_file(d.path().join(format!("f{i}"))).unwrap();
        g.mark();
        while let Ok(m) = rx.try_recv() {
            if let Msg::Changes(cs) = m {
                sent += cs
                    .iter()
                    .filter(|c| matches!(c, Change::Removed(..)))
                    .count() as u64;
            }
        }
        assert_eq!(g.base(0), i + 2, "removal {i}: not counted in the mark");
        assert_eq!(sent, i + 2, "removal {i}: counted, its change not sent");
    }
}
