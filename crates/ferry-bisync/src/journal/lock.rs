//! Where a pair's journal lives by default, and the lock a run holds.

use std::path::{Path, PathBuf};

use super::JournalError;

/// The default journal file of a pair of roots:
/// `$XDG_STATE_HOME/ferry/bisync/<hash>.sqlite` (`~/.local/state` when
/// `XDG_STATE_HOME` is unset), `<hash>` a 64-bit FNV-1a of both roots.
pub fn default_path(roots: (&str, &str)) -> Result<PathBuf, JournalError> {
    let base = match std::env::var_os("XDG_STATE_HOME") {
        Some(s) if !s.is_empty() => PathBuf::from(s),
        _ => match std::env::var_os("HOME") {
            Some(h) if !h.is_empty() => PathBuf::from(h).join(".local/state"),
            _ => return Err(JournalError::NoHome),
        },
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in roots
        .0
        .bytes()
        .chain(std::iter::once(0))
        .chain(roots.1.bytes())
    {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Ok(base.join("ferry/bisync").join(format!("{h:016x}.sqlite")))
}

/// An exclusive lock on `<journal>.lock`, held while a bisync of the pair
/// runs (released when dropped, or by the kernel when the process dies).
pub struct Lock {
    _fd: std::os::fd::OwnedFd,
}

impl Lock {
    /// Take the lock, or fail at once if another run holds it.
    pub fn take(journal: &Path) -> Result<Lock, JournalError> {
        use rustix::fs::{flock, open, FlockOperation, Mode, OFlags};
        if let Some(dir) = journal.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| JournalError::Dir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let mut p = journal.as_os_str().to_owned();
        p.push(".lock");
        let p = PathBuf::from(p);
        let fd = open(
            &p,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|source| JournalError::LockFile {
            path: p.clone(),
            source,
        })?;
        flock(&fd, FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| JournalError::Busy { path: p.clone() })?;
        Ok(Lock { _fd: fd })
    }
}
