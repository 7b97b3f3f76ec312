//! The error at this crate's edge: why a session with a host could not
//! be made, or made again (the one line a run stops with).

use ferry_engine::class::Class;

/// Why a session with a host could not be made or made again: one line
/// naming the host and the cause (what ssh said, what ferry there said).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SessionError(pub String);

impl SessionError {
    /// True when ssh itself failed (unreachable, authentication, host
    /// key, no ssh, no answer for `--timeout`): the host was not reached,
    /// so nothing else over ssh can work either.
    pub fn ssh_failed(&self) -> bool {
        crate::spawn::is_ssh_failure(&self.0)
    }

    /// The engine's class of this error: [`Class::Unavailable`] when the
    /// host was not reached ([`SessionError::ssh_failed`]), else
    /// [`Class::Refused`] (reached, but ferry cannot run or serve there:
    /// the run stops before it changes anything).
    pub fn class(&self) -> Class {
        if self.ssh_failed() {
            Class::Unavailable
        } else {
            Class::Refused
        }
    }

    /// True when the host was reached but cannot run ferry (none there and
    /// none installed, another OS or architecture, ...): SFTP may serve
    /// it instead ([`crate::conn::ferry_cannot_run`]).
    pub fn ferry_cannot_run(&self) -> bool {
        crate::conn::ferry_cannot_run(&self.0)
    }
}

impl From<String> for SessionError {
    fn from(s: String) -> SessionError {
        SessionError(s)
    }
}

impl From<&str> for SessionError {
    fn from(s: &str) -> SessionError {
        SessionError(s.to_string())
    }
}

impl From<SessionError> for String {
    fn from(e: SessionError) -> String {
        e.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::{install, Report};
    use crate::Target;

    /// An install on a host ssh cannot reach fails with the one line ssh's
    /// failure makes, typed, and classified as a server that is not
    /// there (not as a host where ferry cannot run, which SFTP may serve).
    #[test]
    fn an_install_over_a_dead_host_is_unavailable() {
        let here = std::process::Command::new("uname")
            .arg("-sm")
            .output()
            .unwrap();
        let r = Report {
            os: String::from_utf8_lossy(&here.stdout).trim().to_string(),
            dir: "/nonexistent/ferry-cache".into(),
            libc: "glibc 99.0".into(),
            ..Report::default()
        };
        // Nothing listens on port 1: ssh says "Connection refused".
        let t = Target::new("127.0.0.1", Some(1)).unwrap();
        let e = install(&t, &r, "127.0.0.1: no ferry on the remote").unwrap_err();
        assert!(e.ssh_failed(), "{e}");
        assert_eq!(e.class(), Class::Unavailable, "{e}");
        assert!(!e.ferry_cannot_run(), "{e}");
        assert!(e.0.starts_with("127.0.0.1: host unreachable ("), "{e}");
        assert!(
            e.0.contains(" (installing ferry in /nonexistent/ferry-cache/ferry-"),
            "{e}"
        );
    }

    /// A host that was reached but where ferry cannot run, or a cached file
    /// that is not this ferry, refuses the run: same lines as before.
    #[test]
    fn a_reached_host_that_cannot_run_ferry_is_a_refusal() {
        let t = Target::new("h", None).unwrap();
        let e = SessionError(crate::install::not_this(&t, "/c/ferry-x", ""));
        assert_eq!(
            e.to_string(),
            "h: /c/ferry-x is not this ferry (its SHA-256 is \"unknown\"): ferry does not replace a file it did not write; remove it, or name a ferry with --remote-ferry PATH"
        );
        assert_eq!(e.class(), Class::Refused);
        assert!(!e.ferry_cannot_run());
        let e = SessionError("h: no ferry on the remote (none on the PATH, none cached)".into());
        assert_eq!(e.class(), Class::Refused);
        assert!(e.ferry_cannot_run());
    }
}
