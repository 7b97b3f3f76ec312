//! How requests fail, and when to stop trying: error messages that name
//! the `s3://` path and the endpoint and say what a status means, the
//! no-progress timeout, and the rule that declares an endpoint unreachable
//! so a run against a server that is gone ends instead of waiting out the
//! retries of every object.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// A request that receives (or sends) no byte for this long fails, and is
/// retried like a dropped connection (`--timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection that is not established after this long fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Failed attempts in a row, on every request, that could not reach the
/// server (refused, reset, no answer), with no answer of any kind in
/// between: together with one request that used up its retries that way,
/// the endpoint is unreachable and the run stops.
pub const UNREACHABLE_AFTER: u32 = 10;

/// `30 s`, `1.5 s`.
pub fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// The error of a request refused because the endpoint was declared
/// unreachable: the engine's [`Unavailable`](ferry_engine::class::Unavailable)
/// (one class for every backend), which a run reports once, not one line
/// per entry (see `S3Store::unreachable`).
pub use ferry_engine::class::Unavailable as Unreachable;

/// What the store knows of the endpoint's health, shared by every request.
#[derive(Default)]
pub(crate) struct Health {
    /// Attempts in a row that could not reach the server.
    streak: AtomicU32,
    /// Set once the endpoint is declared unreachable: why.
    gone: OnceLock<String>,
    /// A "no answer" notice is out for the current stall.
    stalled: AtomicBool,
}

/// How an attempt went, as far as reaching the server goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reach {
    /// The server answered (any status).
    Answered,
    /// No connection, or it broke, or no byte came for the timeout.
    Failed,
    /// Failed in a way that says nothing about the server (a local error).
    Neutral,
}

impl Health {
    /// Note how an attempt went.
    pub(crate) fn note(&self, r: Reach) {
        match r {
            Reach::Answered => {
                self.streak.store(0, Ordering::Relaxed);
                self.stalled.store(false, Ordering::Relaxed);
            }
            Reach::Failed => {
                self.streak.fetch_add(1, Ordering::Relaxed);
            }
            Reach::Neutral => {}
        }
    }

    /// A request used up its retries without reaching the server: declare
    /// the endpoint unreachable when the attempts failing in a row are
    /// enough. True when it is (now or already).
    pub(crate) fn gave_up(&self, why: &str) -> bool {
        if self.gone.get().is_some() {
            return true;
        }
        let n = self.streak.load(Ordering::Relaxed);
        if n >= UNREACHABLE_AFTER {
            let _ = self
                .gone
                .set(format!("{why} ({n} attempts in a row, none answered)"));
            return true;
        }
        false
    }

    /// Why the endpoint was declared unreachable, once it is.
    pub(crate) fn gone(&self) -> Option<&str> {
        self.gone.get().map(String::as_str)
    }

    /// True the first time in a stall (no answer since the last one).
    pub(crate) fn first_stall(&self) -> bool {
        !self.stalled.swap(true, Ordering::Relaxed)
    }
}

/// An attempt that got no HTTP answer: how it counts and what to say.
pub(crate) fn classify(e: &ureq::Error, endpoint: &str, timeout: Duration) -> (Reach, String) {
    use ureq::Error as E;
    match e {
        E::Timeout(ureq::Timeout::Connect) => (
            Reach::Failed,
            format!(
                "endpoint {endpoint} not reachable: no connection after {}",
                secs(CONNECT_TIMEOUT)
            ),
        ),
        E::Timeout(_) => (
            Reach::Failed,
            format!("no answer from {endpoint} for {}", secs(timeout)),
        ),
        E::HostNotFound => (
            Reach::Failed,
            format!("endpoint {endpoint} not reachable: host not found"),
        ),
        E::ConnectionFailed => (
            Reach::Failed,
            format!("endpoint {endpoint} not reachable: connection failed"),
        ),
        E::Io(io) => io_reach(io, endpoint, timeout),
        other => (Reach::Neutral, format!("{other} ({endpoint})")),
    }
}

/// An I/O error on the way to the server or back.
pub(crate) fn io_reach(e: &io::Error, endpoint: &str, timeout: Duration) -> (Reach, String) {
    use io::ErrorKind as K;
    let what = match e.kind() {
        K::ConnectionRefused => "connection refused",
        K::ConnectionReset => "connection reset",
        K::ConnectionAborted => "connection aborted",
        K::NotConnected => "not connected",
        K::BrokenPipe => "connection closed by the server",
        K::UnexpectedEof => "connection closed by the server",
        K::AddrNotAvailable => "address not available",
        K::HostUnreachable => "host unreachable",
        K::NetworkUnreachable => "network unreachable",
        K::NetworkDown => "network down",
        K::TimedOut | K::WouldBlock => {
            return (
                Reach::Failed,
                format!("no answer from {endpoint} for {}", secs(timeout)),
            )
        }
        _ => return (Reach::Neutral, format!("{e} ({endpoint})")),
    };
    (
        Reach::Failed,
        format!("endpoint {endpoint} not reachable: {what}"),
    )
}

/// What an error status means, in words (empty when the status says it).
pub(crate) fn meaning(status: u16, code: &str, on_bucket: bool) -> &'static str {
    match (status, code) {
        (_, "NoSuchBucket") => "no such bucket",
        (404, _) if on_bucket => "no such bucket",
        (_, "NoSuchKey") => "no such object",
        (_, "NoSuchUpload") => "no such multipart upload",
        (401 | 403, _) => "access denied, check the credentials",
        (_, "SlowDown") | (429, _) => "the server asks to slow down",
        (503, _) => "service unavailable",
        (500..=599, _) => "server error",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_after_a_streak_and_a_request_that_gave_up() {
        let h = Health::default();
        for _ in 0..UNREACHABLE_AFTER - 1 {
            h.note(Reach::Failed);
        }
        assert!(!h.gave_up("x"), "9 failed attempts are not enough");
        h.note(Reach::Answered);
        for _ in 0..UNREACHABLE_AFTER {
            h.note(Reach::Failed);
        }
        h.note(Reach::Neutral);
        assert!(h.gone().is_none(), "only a request that gave up decides");
        assert!(h.gave_up("connection refused"));
        assert!(h.gone().unwrap().starts_with("connection refused"));
        // Sticky: an answer later does not bring it back within the run.
        h.note(Reach::Answered);
        assert!(h.gave_up("y"));
    }

    #[test]
    fn an_answer_breaks_the_streak() {
        let h = Health::default();
        for i in 0..3 * UNREACHABLE_AFTER {
            h.note(if i % 5 == 4 {
                Reach::Answered
            } else {
                Reach::Failed
            });
        }
        assert!(!h.gave_up("x"));
    }

    #[test]
    fn meanings() {
        assert_eq!(meaning(404, "", true), "no such bucket");
        assert_eq!(meaning(404, "NoSuchBucket", false), "no such bucket");
        assert_eq!(meaning(404, "NoSuchKey", false), "no such object");
        assert_eq!(
            meaning(403, "SignatureDoesNotMatch", false),
            "access denied, check the credentials"
        );
        assert_eq!(meaning(400, "InvalidArgument", false), "");
    }

    #[test]
    fn unreachable_is_recognised_through_io_error() {
        let e = io::Error::new(io::ErrorKind::NotConnected, Unreachable("gone".into()));
        assert!(Unreachable::is(&e));
        assert!(!Unreachable::is(&io::Error::other("gone")));
        assert_eq!(e.to_string(), "gone");
    }

    #[test]
    fn io_errors_that_mean_no_server() {
        let (r, m) = io_reach(
            &io::ErrorKind::ConnectionRefused.into(),
            "http://h:1",
            DEFAULT_TIMEOUT,
        );
        assert_eq!(r, Reach::Failed);
        assert_eq!(m, "endpoint http://h:1 not reachable: connection refused");
        let (r, m) = io_reach(
            &io::ErrorKind::TimedOut.into(),
            "http://h:1",
            DEFAULT_TIMEOUT,
        );
        assert_eq!(r, Reach::Failed);
        assert_eq!(m, "no answer from http://h:1 for 30 s");
        let (r, _) = io_reach(
            &io::ErrorKind::PermissionDenied.into(),
            "x",
            DEFAULT_TIMEOUT,
        );
        assert_eq!(r, Reach::Neutral);
    }
}
