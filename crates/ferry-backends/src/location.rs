//! What a location argument names, decided once from its text, before
//! anything is asked of a file system or a server.
//!
//! Rules, in order:
//! - `ssh://[user@]host[:port]/path`: a remote shell location (SSH).
//!   `sftp://[user@]host[:port]/path`: the same, served over SFTP.
//! - Any other `scheme://...` (a letter, then letters, digits, `+`, `-`,
//!   `.`): a URL, served by the backend that claims the scheme
//!   (`s3://BUCKET/PREFIX`: S3); a scheme no backend claims is a usage
//!   error listing those ferry knows ([`crate::Backends::root_of`]).
//! - `[user@]host:path` when the first `:` comes before any `/` (rsync's
//!   rule; `[v6-address]:path` too): a remote shell location (SSH; an
//!   empty path is the remote home). A local name holding a `:` is written
//!   with a `/` before it: `./a:b`, `/abs/a:b`.
//! - Anything else (`/path`, `./rel`, `rel`, names that are not UTF-8): a
//!   local path.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// A location as typed, by backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A local path.
    Local(PathBuf),
    /// A `scheme://...` URL (`s3://bucket/prefix`) other than `ssh://`
    /// and `sftp://`.
    Url {
        /// The scheme, as typed (`s3`).
        scheme: String,
        /// The argument as typed.
        text: String,
    },
    /// `[user@]host:path` or `ssh://...` (the SSH backend), or `sftp://...`
    /// (the SFTP backend).
    Shell {
        /// The argument as typed.
        text: String,
        /// `user@host` (or the URL's authority).
        host: String,
        /// The path on that host.
        path: String,
    },
}

impl Location {
    /// Parse a location argument.
    pub fn parse(arg: &OsStr) -> Location {
        let bytes = arg.as_bytes();
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Location::Local(PathBuf::from(arg));
        };
        for scheme in ["sftp://", "ssh://"] {
            if let Some(rest) = text.strip_prefix(scheme) {
                let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
                return Location::Shell {
                    text: text.to_string(),
                    host: host.to_string(),
                    path: format!("/{path}"),
                };
            }
        }
        if let Some(scheme) = url_scheme(text) {
            return Location::Url {
                scheme: scheme.to_string(),
                text: text.to_string(),
            };
        }
        if let Some((host, path)) = host_and_path(text) {
            return Location::Shell {
                text: text.to_string(),
                host: host.to_string(),
                path: path.to_string(),
            };
        }
        Location::Local(PathBuf::from(arg))
    }

    /// True for local paths.
    pub fn is_local(&self) -> bool {
        matches!(self, Location::Local(_))
    }

    /// The local path, for local locations.
    pub fn local_path(&self) -> Option<&std::path::Path> {
        match self {
            Location::Local(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Url { text, .. } => f.write_str(text),
            Location::Shell { text, .. } => f.write_str(text),
        }
    }
}

/// The scheme of a `scheme://...` URL (RFC 3986's characters).
fn url_scheme(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let mut c = scheme.chars();
    let first = c.next()?;
    (first.is_ascii_alphabetic()
        && c.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// rsync's rule: `host:path` when a `:` comes before any `/`; the host is
/// not empty, and `[...]` brackets an IPv6 address.
fn host_and_path(text: &str) -> Option<(&str, &str)> {
    let end = if text.starts_with('[') || text.contains("@[") {
        text.find("]:")? + 1
    } else {
        text.find(':')?
    };
    let host = &text[..end];
    if host.is_empty() || host.contains('/') {
        return None;
    }
    Some((host, &text[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Location {
        Location::parse(OsStr::new(s))
    }

    fn local(s: &str) -> Location {
        Location::Local(PathBuf::from(s))
    }

    fn shell(text: &str, host: &str, path: &str) -> Location {
        Location::Shell {
            text: text.into(),
            host: host.into(),
            path: path.into(),
        }
    }

    #[test]
    fn local_paths() {
        for s in [
            "/a/b", "./rel", "rel", "a/b:c", "./a:b", "/x:y", ".", "", "../:x",
        ] {
            assert_eq!(p(s), local(s), "{s:?}");
        }
        let odd = OsStr::from_bytes(b"h\xff:x");
        assert_eq!(Location::parse(odd), Location::Local(PathBuf::from(odd)));
    }

    #[test]
    fn s3_urls() {
        let url = |scheme: &str, s: &str| Location::Url {
            scheme: scheme.into(),
            text: s.into(),
        };
        for s in ["s3://b", "s3://b/", "s3://b/p/q", "s3://", "s3://b/a:c"] {
            assert_eq!(p(s), url("s3", s), "{s:?}");
        }
        assert!(!p("s3://b").is_local());
        // Any other scheme is a URL too (which no backend may claim: a
        // usage error then), not rsync's host `gs` with the path `//b`.
        assert_eq!(p("gs://b/t"), url("gs", "gs://b/t"));
        assert_eq!(p("S3://b"), url("S3", "S3://b"));
        assert_eq!(p("a+b.c-d://x"), url("a+b.c-d", "a+b.c-d://x"));
        // Not a scheme: a host (or a local name with a '/' first).
        assert_eq!(p("1x://b"), shell("1x://b", "1x", "//b"));
        assert_eq!(p("./gs://b"), local("./gs://b"));
    }

    #[test]
    fn remote_shell_locations_are_recognised() {
        assert_eq!(p("host:path"), shell("host:path", "host", "path"));
        assert_eq!(p("u@h:/abs"), shell("u@h:/abs", "u@h", "/abs"));
        assert_eq!(p("h:"), shell("h:", "h", ""));
        // A drive-letter-like name is a host here, as in rsync.
        assert_eq!(p("C:"), shell("C:", "C", ""));
        assert_eq!(p("C:/x"), shell("C:/x", "C", "/x"));
        assert_eq!(p("[::1]:d"), shell("[::1]:d", "[::1]", "d"));
        assert_eq!(
            p("u@[fe80::1]:d"),
            shell("u@[fe80::1]:d", "u@[fe80::1]", "d")
        );
        assert_eq!(p("sftp://h/p/q"), shell("sftp://h/p/q", "h", "/p/q"));
        assert_eq!(p("ssh://u@h"), shell("ssh://u@h", "u@h", "/"));
        // No host before the colon: a local name.
        assert_eq!(p(":x"), local(":x"));
        assert_eq!(p("[::1"), local("[::1"));
    }
}
