//! One classification of what went wrong, for every backend: what the
//! command line's output and exit code are decided by (docs/CLI.md, "Exit
//! codes").
//!
//! - [`Class::Unavailable`]: the server behind a store is gone for this
//!   run (an S3 endpoint declared unreachable, an SSH or SFTP connection
//!   lost). Each backend makes these errors with [`Unavailable`]; a run
//!   says it once ("stopped; rerun to finish"), not once per entry.
//! - [`Class::Refused`]: the run was refused before it changed anything
//!   ([`crate::Refused`]): exit 2.
//! - [`Class::NotFound`]: the entry is not there (removed while the run
//!   went).
//! - [`Class::PerEntry`]: anything else: that entry failed (exit 1).

use std::io;

/// What an error means to a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The server behind a store is gone for this run.
    Unavailable,
    /// The run was refused before it changed anything.
    Refused,
    /// The entry is not there.
    NotFound,
    /// That entry failed.
    PerEntry,
}

/// The error of a request whose server is gone for this run (an S3
/// endpoint declared unreachable, an SSH or SFTP connection lost): the
/// one line saying why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

impl Unavailable {
    /// True when `e` is (or carries) an [`Unavailable`].
    pub fn is(e: &io::Error) -> bool {
        e.get_ref()
            .is_some_and(|i| i.downcast_ref::<Unavailable>().is_some())
    }
}

/// The class of `e`.
pub fn classify(e: &io::Error) -> Class {
    if Unavailable::is(e) {
        Class::Unavailable
    } else if crate::Refused::of(e).is_some() {
        Class::Refused
    } else if e.kind() == io::ErrorKind::NotFound {
        Class::NotFound
    } else {
        Class::PerEntry
    }
}

/// The cause of an error, without the "(os error N)" suffix.
pub fn cause(e: &io::Error) -> String {
    let mut s = e.to_string();
    // Each ` (os error N)`, wherever it is: a message may quote an OS
    // error inside its own words (`SFTP session lost (Connection reset by
    // peer (os error 104)) (ssh: ...)`), which stay whole.
    while let Some(i) = s.find(" (os error ") {
        match s[i..].find(')') {
            Some(j) => s.replace_range(i..i + j + 1, ""),
            None => {
                s.truncate(i);
                break;
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_class_per_error() {
        let gone = io::Error::new(io::ErrorKind::NotConnected, Unavailable("gone".into()));
        assert_eq!(classify(&gone), Class::Unavailable);
        let no = io::Error::other(crate::Refused("no".into()));
        assert_eq!(classify(&no), Class::Refused);
        assert_eq!(classify(&io::Error::from_raw_os_error(2)), Class::NotFound);
        assert_eq!(classify(&io::Error::other("x")), Class::PerEntry);
        // Wrapped in another kind: still what it carries.
        let lost = io::Error::new(io::ErrorKind::ConnectionAborted, Unavailable("l".into()));
        assert_eq!(classify(&lost), Class::Unavailable);
    }

    #[test]
    fn causes_lose_os_error_numbers_only() {
        let e = |m: &str| cause(&io::Error::other(m.to_string()));
        assert_eq!(
            e("h: SFTP session lost (Connection reset by peer (os error 104)) (ssh: gone)"),
            "h: SFTP session lost (Connection reset by peer) (ssh: gone)"
        );
        assert_eq!(
            cause(&io::Error::from_raw_os_error(2)),
            "No such file or directory"
        );
        assert_eq!(e("odd (os error 5"), "odd");
    }
}
