//! The error at this crate's edge: why a session with a host could not
//! be made, or made again (the one line a run stops with).

/// Why a session with a host could not be made or made again: one line
/// naming the host and the cause (what ssh said, what ferry there said).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SessionError(pub String);

impl SessionError {
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
