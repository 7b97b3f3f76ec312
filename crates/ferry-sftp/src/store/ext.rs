//! The extensions the SFTP store has: keeping replaced entries (a rename
//! or a copy on the server), symlinks, and the pipeline (opens sent ahead,
//! a file's writes and its commit sent without waiting for each reply).

use super::*;
use ferry_engine::store::{KeepStore, LinkStore, PipelineStore};

impl KeepStore<SftpStore> for SftpStore {
    fn keeps_at(&self, _base: &KeepBase) -> bool {
        true
    }
    fn keep(&self, dir: &SftpDir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
        self.keep_entry(dir, name, to)
    }
}

impl LinkStore<SftpStore> for SftpStore {
    fn read_link(&self, dir: &SftpDir, name: &CStr) -> io::Result<Vec<u8>> {
        self.conn()
            .call(Req::path(w::READLINK, &join(&dir.path, name.to_bytes())))?
            .name()
    }

    fn create_symlink(
        &self,
        dir: &SftpDir,
        name: &CStr,
        target: &[u8],
        meta: &Meta,
    ) -> io::Result<()> {
        let tmp = temp_path(&dir.path);
        // OpenSSH's order: the target first, then the link's path.
        self.ok(Req::path(w::SYMLINK, target).str(&tmp))?;
        let done = self
            .set_path(&tmp, Kind::Symlink, &set_of(meta, MetaChange::ALL))
            .and_then(|()| self.replace(&dir.path, &tmp, &join(&dir.path, name.to_bytes())));
        if done.is_err() {
            let _ = self.ok(Req::path(w::REMOVE, &tmp));
        }
        done
    }

    fn sets_symlink_times(&self, dir: &SftpDir, name: &CStr, now: &Meta) -> bool {
        // Tried once per run, on this link, to its time as listed (no
        // change): a server may offer lsetstat@openssh.com and refuse it.
        // A dry run sets no attribute at all (the server changes nothing,
        // not even the link's change time): a server that refuses the
        // request refuses that too.
        let tried = *self.link_times.get_or_init(|| {
            if !self.conn().ext.lsetstat {
                return false;
            }
            let set = Set {
                mode: None,
                mtime: (!self.target.read_only).then(|| secs(now)),
                owner: None,
            };
            let _ = self.lsetstat(&join(&dir.path, name.to_bytes()), &set);
            true
        });
        // (Refused later, on another link: not tried again this run.)
        tried && !self.lsetstat_refused.load(Ordering::Relaxed)
    }
}

impl PipelineStore<SftpStore> for SftpStore {
    /// Opened as any directory (no request of its own to save).
    fn open_dir_to_list(&self, parent: &SftpDir, name: &CStr) -> io::Result<SftpDir> {
        Store::open_dir(self, parent, name)
    }
    fn expect_dirs(&self, _root: &SftpDir, _dirs: &[Vec<u8>]) {}
    fn open_ahead(&self, dir: &SftpDir, files: &[(&CStr, u64)]) {
        let main = self.conn();
        if main.alive().is_err() {
            return;
        }
        crate::ahead::open(&dir.ahead, &dir.path, files, main.chunk, || {
            main.next_small(main.width())
        });
    }

    fn commit_nowait<'a>(
        &'a self,
        dir: &'a SftpDir,
        wr: SftpWriter,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> Committing<'a> {
        // The file's requests go as their replies allow, moved on by
        // whichever commit of this worker is waited for (`pipe`).
        let path = join(&dir.path, name.to_bytes());
        let need = meta.size;
        match wr.into_flight() {
            Ok(parts) => {
                let f = crate::pipe::start(parts, path, meta, fsync);
                Committing::later(move || {
                    crate::pipe::wait(f).map_err(|e| self.full_disk(&dir.path, need, e))
                })
            }
            Err(wr) => Committing::done(
                wr.commit(self, &path, meta, fsync)
                    .map_err(|e| self.full_disk(&dir.path, need, e)),
            ),
        }
    }

    fn meta_after_commit(&self, _written: &Meta) -> Option<Meta> {
        None
    }

    fn create_empty(
        &self,
        dir: &SftpDir,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<bool> {
        crate::write::create_empty(self, &join(&dir.path, name.to_bytes()), meta, fsync)
            .map_err(|e| self.full_disk(&dir.path, 0, e))
    }
}
