//! SIGINT and SIGTERM: the first one asks the loop to stop after the run in
//! flight (a thread blocked on a self-pipe forwards it, so no thread wakes
//! while nothing happens); a second one ends the process at once (exit 130).

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::Msg;

/// Install the handlers; the first signal calls `on_stop` (at once, while
/// a run may be in flight) and sends [`Msg::Stop`] to `tx`.
pub fn forward(tx: Sender<Msg>, on_stop: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let (mut rd, wr) = UnixStream::pair()?;
    let seen = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // Registered first, so it sees the flag as the earlier signal left it.
        signal_hook::flag::register_conditional_shutdown(sig, 130, seen.clone())?;
        signal_hook::flag::register(sig, seen.clone())?;
        signal_hook::low_level::pipe::register(sig, wr.try_clone()?)?;
    }
    std::thread::Builder::new()
        .name("ferry-signals".into())
        .spawn(move || {
            let mut b = [0u8; 1];
            if rd.read(&mut b).is_ok() {
                on_stop();
                let _ = tx.send(Msg::Stop);
            }
        })?;
    Ok(())
}

/// A run without `--watch` stopped by a signal (`bisync`): the first
/// SIGINT or SIGTERM calls `on_stop` at once, from a thread, and then sets
/// [`Stop::flag`] (the run begins no further entry): what `on_stop` says
/// is said before the run can end (set by the handler itself, the flag
/// let a loaded machine's run end and exit before the note, found by
/// `bisync_stop::a_signal_during_conflicts_loses_nothing_and_makes_no_new_conflict`);
/// a second one ends the process at once (exit 130).
pub struct Stop {
    /// Set by either signal.
    pub flag: Arc<AtomicBool>,
    term: Arc<AtomicBool>,
}

impl Stop {
    /// Install the handlers.
    pub fn install(on_stop: impl FnOnce() + Send + 'static) -> std::io::Result<Stop> {
        let (mut rd, wr) = UnixStream::pair()?;
        let flag = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicBool::new(false));
        let term = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            signal_hook::flag::register_conditional_shutdown(sig, 130, seen.clone())?;
            signal_hook::flag::register(sig, seen.clone())?;
            signal_hook::low_level::pipe::register(sig, wr.try_clone()?)?;
        }
        signal_hook::flag::register(SIGTERM, term.clone())?;
        let set = flag.clone();
        std::thread::Builder::new()
            .name("ferry-signals".into())
            .spawn(move || {
                let mut b = [0u8; 1];
                if rd.read(&mut b).is_ok() {
                    on_stop();
                    set.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            })?;
        Ok(Stop { flag, term })
    }

    /// The exit code of a run the signal stopped: 128 + its number, as a
    /// shell shows a process the signal ended (130 SIGINT, 143 SIGTERM).
    pub fn code(&self) -> u8 {
        if self.term.load(std::sync::atomic::Ordering::Relaxed) {
            143
        } else {
            130
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::mpsc::channel;

    /// The run sees the stop only once `on_stop` has said its note (held
    /// here until the test lets it go): it cannot end before the note.
    #[test]
    fn the_flag_is_set_after_the_note_is_said() {
        let (started, is_started) = channel();
        let (release, released) = channel::<()>();
        let stop = Stop::install(move || {
            started.send(()).unwrap();
            released.recv().unwrap();
        })
        .unwrap();
        signal_hook::low_level::raise(SIGINT).unwrap();
        is_started.recv().unwrap();
        assert!(!stop.flag.load(Ordering::SeqCst), "set before the note");
        release.send(()).unwrap();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !stop.flag.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < end, "never set");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(stop.code(), 130);
    }
}
