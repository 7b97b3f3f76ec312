//! Listing a local directory.

use super::*;

impl LocalStore {
    /// [`Store::list`]: names with `getdents64`, then metadata with
    /// `statx` (in parallel for a big directory); rollback records of
    /// appends in place handled on the way.
    pub(super) fn list_dir(
        &self,
        dir: &LocalDir,
        _rel: &[u8],
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        out.clear();
        // Rollback records of appends in place ([`crate::append`]).
        let mut undo: Vec<CString> = Vec::new();
        // Phase 1: names (getdents64).
        DIRBUF.with(|buf| -> io::Result<()> {
            let mut buf = buf.borrow_mut();
            // From the start: a handle listed before is at its end.
            rfs::seek(&dir.fd, rfs::SeekFrom::Start(0))?;
            let mut iter = RawDir::new(&dir.fd, &mut buf[..]);
            while let Some(ent) = iter.next() {
                let ent = ent?;
                let name = ent.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                if is_undo_name(name) {
                    undo.push(ent.file_name().to_owned());
                    continue;
                }
                let kind = match ent.file_type() {
                    FileType::RegularFile => Kind::File,
                    FileType::Directory => Kind::Dir,
                    FileType::Symlink => Kind::Symlink,
                    FileType::Fifo => Kind::Fifo,
                    FileType::CharacterDevice => Kind::CharDev,
                    FileType::BlockDevice => Kind::BlockDev,
                    FileType::Socket => Kind::Socket,
                    _ => Kind::Other,
                };
                out.push(
                    name,
                    Meta {
                        kind,
                        ino: ent.ino(),
                        ..EMPTY_META
                    },
                );
            }
            Ok(())
        })?;

        // What a killed run left half appended is rolled back before
        // anything is stat'ed (or read); a record a live append holds, or
        // one that cannot be handled now, is left (and never listed).
        if !self.is_read_only() {
            for rec in &undo {
                let _ = crate::append::recover(dir.fd(), rec);
            }
        }
        // Phase 2: statx each entry relative to the directory fd.
        let n = out.len();
        let mut failed: Vec<(usize, io::Error)> = Vec::new();
        let threads = if n >= PARALLEL_STAT_MIN {
            self.stat_threads.min(n / (PARALLEL_STAT_MIN / 2)).max(1)
        } else {
            1
        };
        {
            let (names_listing, entries) = out.parts_mut();
            let fd = dir.fd.as_fd();
            if threads <= 1 {
                stat_chunk(fd, names_listing, entries, 0, &mut failed);
            } else {
                let chunk = n.div_ceil(threads);
                std::thread::scope(|s| {
                    let handles: Vec<_> = entries
                        .chunks_mut(chunk)
                        .enumerate()
                        .map(|(i, part)| {
                            s.spawn(move || {
                                let mut f = Vec::new();
                                stat_chunk(fd, names_listing, part, i * chunk, &mut f);
                                f
                            })
                        })
                        .collect();
                    for h in handles {
                        failed.extend(h.join().expect("stat thread panicked"));
                    }
                });
            }
        }
        if !failed.is_empty() {
            failed.sort_by_key(|(i, _)| *i);
            let mut drop = vec![false; n];
            for (i, err) in failed {
                drop[i] = true;
                if err.kind() != io::ErrorKind::NotFound {
                    let e = out.entries()[i];
                    errors.push(ListError {
                        name: out.name(&e).to_vec(),
                        err,
                    });
                }
            }
            let mut idx = 0;
            out.retain(|_| {
                let keep = !drop[idx];
                idx += 1;
                keep
            });
        }
        out.sort();
        Ok(())
    }
}
