//! `--watch` of an ssh side: `ferry serve` watches its own tree with the
//! same inotify code as a local side ([`ferry_engine::watch::watch_tree`]) and
//! streams the changes back ([`Req::Watch`]), on a connection of its own.
//!
//! The server's watch ends when its client goes away: the request reader
//! drops the write end of a pipe the tree's thread polls beside its
//! inotify descriptor, then joins it (`Watching`). The client
//! ([`RemoteWatch`], a [`ferry_engine::watch::Source`]) hands the changes to the
//! loop; when the stream ends (ssh or the network gone) it says so once,
//! has the side polled, and tries again at every poll interval; once the
//! watch is back, the loop runs whole once (a change may have been
//! missed). A root that is missing is reported as gone, never compared.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use ferry_engine::watch::{watch_tree, Change, Msg, NotWatched};

use crate::conn::{self, unexpected, Body, Target};
use crate::proto::{self, Event, Req, Resp};

// ---- server ---------------------------------------------------------------------------------

/// A watch `ferry serve` runs for its client: dropped (when the client
/// has gone), it stops its threads and waits for them.
pub(crate) struct Watching {
    stop: Option<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        // The pipe's read end hangs up: the tree's thread returns, then
        // the forwarder sees its channel closed.
        self.stop.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The absolute path of the tree at `path` (relative: to the working
/// directory, the home under ssh), symlinks resolved when it is there.
fn root_of(path: &[u8]) -> PathBuf {
    let path = crate::serve::local_path(path).unwrap_or(std::borrow::Cow::Borrowed(path));
    let p = Path::new(OsStr::from_bytes(&path));
    std::fs::canonicalize(p).unwrap_or_else(|_| match std::env::current_dir() {
        Ok(d) => d.join(p),
        Err(_) => p.to_path_buf(),
    })
}

/// Answer [`Req::Watch`] `id`: the tree watched, whether it is there,
/// then its changes, all written to `out`. `None` when it cannot be
/// watched (the error is the reply).
pub(crate) fn serve_watch(
    out: Sender<proto::Out>,
    id: u64,
    path: &[u8],
    poll: u64,
) -> Option<Watching> {
    let root = root_of(path);
    let poll = Duration::from_millis(poll.max(100));
    let started = watch_tree(&root, poll).and_then(|t| {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        Ok((t, r, w))
    });
    let (tree, stop_r, stop_w) = match started {
        Ok(x) => x,
        Err(e) => {
            let e = io::Error::new(e.kind(), format!("{}: inotify: {e}", root.display()));
            let _ = out.send(proto::frame(id, &Resp::Err((&e).into())).into());
            return None;
        }
    };
    // The reply goes from the forwarding thread, before any change and
    // once the inotify thread is started.
    let there = !tree.is_gone();
    let (tx, rx) = mpsc::channel::<Msg>();
    let failed = out.clone();
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new().name(name.into()).spawn(f).ok()
    };
    let threads = [
        spawn(
            "ferry-serve-inotify",
            Box::new(move || tree.run_until(tx, Some(stop_r))),
        ),
        spawn(
            "ferry-serve-watch",
            Box::new(move || {
                if out
                    .send(proto::frame(id, &Resp::Bool(there)).into())
                    .is_err()
                {
                    return;
                }
                for m in rx {
                    let f = match m {
                        Msg::Changes(cs) => proto::frame(
                            id,
                            &Resp::Changes(cs.into_iter().map(Event::of).collect()),
                        ),
                        Msg::Note(n) => proto::frame(id, &Resp::Note(n)),
                        _ => continue,
                    };
                    if out.send(f.into()).is_err() {
                        return;
                    }
                }
            }),
        ),
    ];
    if threads.iter().any(Option::is_none) {
        let e = io::Error::other(format!(
            "{}: watch: no thread could be started",
            root.display()
        ));
        let _ = failed.send(proto::frame(id, &Resp::Err((&e).into())).into());
    }
    Some(Watching {
        stop: Some(stop_w),
        threads: threads.into_iter().flatten().collect(),
    })
}

// ---- client ---------------------------------------------------------------------------------

/// An ssh side watched by its remote ferry: a [`ferry_engine::watch::Source`].
pub struct RemoteWatch {
    target: Target,
    path: Vec<u8>,
    /// `host:path`, for messages.
    name: String,
    poll: Duration,
}

type Stream = Receiver<io::Result<Vec<u8>>>;

impl RemoteWatch {
    pub(crate) fn new(target: Target, path: Vec<u8>, poll: Duration) -> RemoteWatch {
        let name = format!("{}:{}", target.host, String::from_utf8_lossy(&path));
        RemoteWatch {
            target,
            path,
            name,
            poll,
        }
    }

    /// A connection of its own asked to watch: its stream of replies and
    /// whether the tree is there; or why not (one line).
    fn establish(&self) -> Result<(Stream, bool), NotWatched> {
        let c = conn::open_own(&self.target).map_err(|e| NotWatched(e.0))?;
        let failed = |why: String| {
            c.close();
            Err(NotWatched(format!(
                "{}: the remote ferry cannot watch it ({why})",
                self.name
            )))
        };
        let rx = match c.stream(&Req::Watch {
            path: &self.path,
            poll: self.poll.as_millis() as u64,
        }) {
            Ok(rx) => rx,
            Err(e) => return failed(e.to_string()),
        };
        match rx.recv() {
            Ok(Ok(b)) => match Body(b).get() {
                Ok(Resp::Bool(there)) => Ok((rx, there)),
                Ok(r) => failed(unexpected(&r).to_string()),
                Err(e) => failed(e.to_string()),
            },
            Ok(Err(e)) => failed(e.to_string()),
            Err(_) => failed("connection lost".into()),
        }
    }

    /// Hand the stream's changes to the loop; when it ends, have the side
    /// polled until a new watch is made, and go on with that one. Returns
    /// when the loop has gone.
    fn follow(self, side: usize, tx: Sender<Msg>, mut rx: Stream, mut gone: bool) {
        loop {
            let why = loop {
                let b = match rx.recv() {
                    Ok(Ok(b)) => b,
                    Ok(Err(e)) => break e.to_string(),
                    Err(_) => break "connection lost".to_string(),
                };
                let m = match Body(b).get() {
                    Ok(Resp::Changes(evs)) => {
                        for e in &evs {
                            match e {
                                Event::Gone => gone = true,
                                Event::Back => gone = false,
                                _ => {}
                            }
                        }
                        Msg::Changes(evs.into_iter().map(|e| e.change(side)).collect())
                    }
                    Ok(Resp::Note(n)) => Msg::Note(format!("{}: {n}", self.name)),
                    Ok(r) => break unexpected(&r).to_string(),
                    Err(e) => break e.to_string(),
                };
                if tx.send(m).is_err() {
                    return;
                }
            };
            let lost = Msg::Note(format!(
                "{}: the remote watch is lost ({why}): polled every {:?} until it is back",
                self.name, self.poll
            ));
            if tx.send(lost).is_err() || tx.send(Msg::Polled(side, true)).is_err() {
                return;
            }
            rx = loop {
                std::thread::sleep(self.poll);
                if let Ok((rx, there)) = self.establish() {
                    let mut cs = Vec::new();
                    if there && gone {
                        cs.push(Change::Back(side));
                    } else if !there && !gone {
                        cs.push(Change::Gone(side));
                    }
                    gone = !there;
                    let back = Msg::Note(format!(
                        "{}: the remote watch is back: the whole tree is compared again",
                        self.name
                    ));
                    if (!cs.is_empty() && tx.send(Msg::Changes(cs)).is_err())
                        || tx.send(back).is_err()
                        || tx.send(Msg::Polled(side, false)).is_err()
                    {
                        return;
                    }
                    break rx;
                }
            };
        }
    }
}

impl ferry_engine::watch::Source for RemoteWatch {
    fn start(self: Box<Self>, side: usize, tx: Sender<Msg>) -> Result<(), NotWatched> {
        let (rx, there) = self.establish()?;
        if !there {
            let _ = tx.send(Msg::Changes(vec![Change::Gone(side)]));
        }
        std::thread::Builder::new()
            .name(format!("ferry-remote-watch-{side}"))
            .spawn(move || self.follow(side, tx, rx, !there))
            .map_err(|e| NotWatched(format!("a thread: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;

    /// The tests that count threads run one at a time; each plugs in the
    /// tree watcher (as the binary does).
    static ONE: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    fn one() -> parking_lot::MutexGuard<'static, ()> {
        ferry_watch::inotify::plug();
        ONE.lock()
    }

    /// The watch threads of `ferry serve` in this process.
    fn serve_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim().starts_with("ferry-serve-"))
            })
            .count()
    }

    fn next(r: &mut impl io::Read) -> Vec<Event> {
        let (id, body) = proto::read_frame(r).unwrap().expect("a frame");
        assert_eq!(id, 7);
        match proto::decode::<Resp>(&body).unwrap() {
            Resp::Changes(evs) => evs,
            other => panic!("{other:?}"),
        }
    }

    /// `ferry serve` streams a watched tree's changes with the request's
    /// id, and when its client closes the stream it returns, its watch's
    /// threads stopped and joined.
    #[test]
    fn serve_streams_changes_and_stops_when_the_client_goes() {
        let _one = one();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let (in_r, in_w) = rustix::pipe::pipe().unwrap();
        let (out_r, out_w) = rustix::pipe::pipe().unwrap();
        let server = std::thread::spawn(move || {
            crate::serve::serve_on(io::BufReader::new(File::from(in_r)), File::from(out_w))
        });
        let mut to = File::from(in_w);
        let mut from = io::BufReader::new(File::from(out_r));
        proto::write_hello(&mut to).unwrap();
        assert!(matches!(
            proto::read_hello(&mut from).unwrap(),
            proto::Hello::Ferry { .. }
        ));
        let path = dir.path().as_os_str().as_bytes();
        to.write_all(&proto::frame(7, &Req::Watch { path, poll: 1000 }))
            .unwrap();
        let (id, body) = proto::read_frame(&mut from).unwrap().unwrap();
        assert_eq!(id, 7);
        assert!(matches!(
            proto::decode::<Resp>(&body).unwrap(),
            Resp::Bool(true)
        ));
        // (Its threads are started right after its reply.)
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while serve_threads() < 2 {
            assert!(std::time::Instant::now() < end, "no watch threads");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(dir.path().join("d/f"), b"x").unwrap();
        let mut seen = Vec::new();
        while !seen.contains(&Event::Entry(b"d/f".to_vec(), true)) {
            seen.extend(next(&mut from));
        }
        std::fs::rename(dir.path().join("d"), dir.path().join("e")).unwrap();
        let mut seen = Vec::new();
        while !seen.contains(&Event::Rename(b"d".to_vec(), b"e".to_vec(), true)) {
            seen.extend(next(&mut from));
        }
        // The client goes: the server returns, its watch stopped.
        drop(to);
        server.join().unwrap().unwrap();
        assert!(proto::read_frame(&mut from).unwrap().is_none());
        assert_eq!(serve_threads(), 0);
    }

    /// A missing tree is watched (for its return) and said to be missing.
    #[test]
    fn a_missing_tree_is_watched_as_gone() {
        let _one = one();
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let missing = dir.path().join("not/yet");
        let w = serve_watch(tx, 3, missing.as_os_str().as_bytes(), 1000).expect("watched");
        let proto::Out::Frame(f) = rx.recv().unwrap() else {
            panic!("a whole frame")
        };
        let (id, body) = proto::read_frame(&mut &f[..]).unwrap().unwrap();
        assert_eq!(id, 3);
        assert!(matches!(
            proto::decode::<Resp>(&body).unwrap(),
            Resp::Bool(false)
        ));
        drop(w);
    }
}
