//! Keeping an entry a run replaces or removes (`--backup-dir`, `--suffix`,
//! `--versions`; see `ferry_engine::keep`) over SFTP: all on the server,
//! never a download.
//!
//! An entry about to be removed is renamed to its kept path: SFTP's own
//! `RENAME`, which never replaces, when the kept path must not exist, and
//! a replacing rename (`posix-rename@openssh.com`, or moved aside first)
//! when an older kept entry there is to be replaced. An entry about to be
//! replaced is hard-linked there (`hardlink@openssh.com`, which OpenSSH
//! offers), so its name stays until the commit replaces it; a server
//! without that extension has it renamed too, and then the name is
//! missing between the keep and the commit that puts the new content
//! there (a moment; nothing is lost: the old content is at its kept path).
//! The target's missing parents are made with `MKDIR` (default modes).

use std::ffi::CStr;
use std::io;

use ferry_engine::keep::{KeepBase, KeepTo};

use crate::store::{join, temp_path, SftpDir, SftpStore};
use crate::wire::{self as w, Req, Set};

/// The parent of a `/`-separated path (`None` for a single name or `/`).
fn parent(p: &[u8]) -> Option<&[u8]> {
    let p = p.strip_suffix(b"/").unwrap_or(p);
    match p.iter().rposition(|&c| c == b'/') {
        Some(0) | None => None,
        Some(i) => Some(&p[..i]),
    }
}

impl SftpStore {
    /// The kept path of `to`, as the server names it.
    pub(crate) fn keep_target(&self, to: &KeepTo<'_>) -> Vec<u8> {
        let base = match to.base {
            KeepBase::Root(p) => join(&self.root, p),
            KeepBase::Abs(p) => p.clone(),
        };
        join(&base, to.path)
    }

    /// See [`ferry_engine::store::KeepStore::keep`] and the module's comment.
    pub(crate) fn keep_entry(&self, dir: &SftpDir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
        let from = join(&dir.path, name.to_bytes());
        // Moved away only while it is still the entry planned (one LSTAT).
        if let (false, Some(p)) = (to.replacing, &to.planned) {
            crate::write::check_planned(&self.conn(), &from, p)?;
        }
        let t = self.keep_target(to);
        let mut made_parents = false;
        loop {
            let res = if to.replacing && self.hardlink {
                self.link_to(&from, &t, to.overwrite)
            } else {
                self.move_to(&from, &t, to.overwrite)
            };
            match res {
                Err(e) if e.kind() == io::ErrorKind::NotFound && !made_parents => {
                    // The first entry kept in that directory: make its
                    // parents (only now: an unreplaced tree costs nothing).
                    if let Some(p) = parent(&t) {
                        self.mkdir_p(p)?;
                    }
                    made_parents = true;
                }
                Err(e) if e.kind() == io::ErrorKind::Other && !to.overwrite => {
                    // SFTP says only "failure" for an existing target.
                    return Err(match self.stat_path(&t, false)? {
                        Some(_) => io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!("{}: exists", String::from_utf8_lossy(&t)),
                        ),
                        None => e,
                    });
                }
                r => return r,
            }
        }
    }

    /// Rename `from` to `t`, replacing an entry there when `overwrite`.
    fn move_to(&self, from: &[u8], t: &[u8], overwrite: bool) -> io::Result<()> {
        if overwrite {
            self.replace(parent(t).unwrap_or(b"."), from, t)
        } else {
            self.ok(Req::path(w::RENAME, from).str(t))
        }
    }

    /// Hard-link `from` at `t`; with `overwrite`, an entry there is
    /// replaced (linked beside it, then renamed over it).
    fn link_to(&self, from: &[u8], t: &[u8], overwrite: bool) -> io::Result<()> {
        let link = |at: &[u8]| self.ok(Req::ext("hardlink@openssh.com").str(from).str(at));
        match link(t) {
            Err(e) if overwrite && e.kind() == io::ErrorKind::Other => {
                if self.stat_path(t, false)?.is_none() {
                    return Err(e);
                }
                let dir = parent(t).unwrap_or(b".");
                let tmp = temp_path(dir);
                link(&tmp)?;
                self.replace(dir, &tmp, t).inspect_err(|_| {
                    let _ = self.ok(Req::path(w::REMOVE, &tmp));
                })
            }
            r => r,
        }
    }

    /// Make directory `p` and its missing parents.
    fn mkdir_p(&self, p: &[u8]) -> io::Result<()> {
        let mk = || self.ok(Req::path(w::MKDIR, p).attrs(&Set::default()));
        match mk() {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(up) = parent(p) {
                    self.mkdir_p(up)?;
                }
                mk().or_else(|e| self.is_dir(p, e))
            }
            Err(e) => self.is_dir(p, e),
        }
    }

    /// `Ok` when `p` is a directory (made meanwhile, or there before),
    /// else `e`.
    fn is_dir(&self, p: &[u8], e: io::Error) -> io::Result<()> {
        match self.stat_path(p, true)? {
            Some(m) if m.kind == ferry_engine::entry::Kind::Dir => Ok(()),
            _ => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parent;

    #[test]
    fn parents_of_paths() {
        assert_eq!(parent(b"a/b/c"), Some(&b"a/b"[..]));
        assert_eq!(parent(b"/a/b"), Some(&b"/a"[..]));
        assert_eq!(parent(b"/a"), None);
        assert_eq!(parent(b"a"), None);
        assert_eq!(parent(b"a/b/"), Some(&b"a"[..]));
    }
}
