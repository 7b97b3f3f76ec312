//! Why a location cannot be used: one typed error for the registry's
//! edge, every variant a usage or configuration error (exit 2).

use ferry_engine::class::Class;

/// Why a location could not be parsed, resolved or opened.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The S3 configuration (endpoint, credentials, URL) is unusable.
    #[error(transparent)]
    S3(#[from] ferry_s3::ConfigError),
    /// A `scheme://` no backend claims.
    #[error(
        "{text}: unknown scheme {scheme}:// (ferry knows {known}; for a local name write ./{text})"
    )]
    UnknownScheme {
        /// The location as typed.
        text: String,
        /// Its scheme.
        scheme: String,
        /// The schemes ferry knows, `s3://, ssh://, ...`.
        known: String,
    },
    /// The SSH or SFTP connection could not be made, or ferry could not
    /// run there (the one line says why).
    #[error("{0}")]
    Connect(String),
    /// The server is gone for this run (a connection lost).
    #[error("{0}")]
    Unavailable(String),
    /// What a location names cannot be used as asked (missing, not a
    /// directory, overlapping the other side): the one line.
    #[error("{0}")]
    Refused(String),
}

impl Error {
    /// The engine's class of this error.
    pub fn class(&self) -> Class {
        match self {
            Error::Unavailable(_) => Class::Unavailable,
            Error::S3(_) | Error::UnknownScheme { .. } | Error::Connect(_) | Error::Refused(_) => {
                Class::Refused
            }
        }
    }

    /// The same error with `prefix` before its line (`SRC `, `DST x: `).
    pub fn context(self, prefix: &str) -> Error {
        Error::Refused(format!("{prefix}{self}"))
    }
}

impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}
