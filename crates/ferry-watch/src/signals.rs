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
/// SIGINT or SIGTERM sets [`Stop::flag`] (the run begins no further
/// entry) and calls `on_stop` at once, from a thread; a second one ends
/// the process at once (exit 130).
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
        let term = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            signal_hook::flag::register_conditional_shutdown(sig, 130, flag.clone())?;
            signal_hook::flag::register(sig, flag.clone())?;
            signal_hook::low_level::pipe::register(sig, wr.try_clone()?)?;
        }
        signal_hook::flag::register(SIGTERM, term.clone())?;
        std::thread::Builder::new()
            .name("ferry-signals".into())
            .spawn(move || {
                let mut b = [0u8; 1];
                if rd.read(&mut b).is_ok() {
                    on_stop();
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
