//! The answers of `ferry serve` to the requests its workers carry out:
//! [`answer`] hands each request to the handler of its kind, and each
//! handler returns the reply's frame (an error frame for its error).

use super::*;

/// The reply to `req` (of id `id`): its answer, or its error.
pub(super) fn answer(st: &State, id: u64, req: Req<'_>, listing: &mut Listing) -> Vec<u8> {
    match answer_io(st, id, req, listing) {
        Ok(f) => f,
        Err(e) => err_frame(id, &e),
    }
}

/// `Ok` as the reply to a request whose act was `r`.
fn ok(id: u64, r: io::Result<()>) -> io::Result<Vec<u8>> {
    r.map(|()| proto::frame(id, &Resp::Ok))
}

fn answer_io(st: &State, id: u64, req: Req<'_>, listing: &mut Listing) -> io::Result<Vec<u8>> {
    let s = &st.store;
    match req {
        Req::Root { path, dir, create } => root(st, id, path, dir, create),
        Req::Space { dir } => {
            let (bytes, inodes) = ferry_local::local::free_space(dir_of(st, dir)?.fd())
                .ok_or_else(|| io::Error::other("statvfs failed"))?;
            Ok(proto::frame(id, &Resp::Space { bytes, inodes }))
        }
        Req::StatPath { path, follow } => stat_path(id, path, follow),
        Req::Stat { dir, name } => {
            let m = s.stat(&*dir_of(st, dir)?, &cname(name)?)?;
            Ok(proto::frame(id, &Resp::Meta(m.map(M))))
        }
        Req::List { dir } => list(st, id, dir, listing),
        Req::MakeDir { dir, name, new } => {
            let d = s.make_dir(&*dir_of(st, dir)?, &cname(name)?)?;
            st.dirs.lock().insert(new, Arc::new(d));
            ok(id, Ok(()))
        }
        Req::SetDirMeta { dir, meta, what } => ok(
            id,
            s.set_dir_meta(&*dir_of(st, dir)?, &meta.0, what_of(what)),
        ),
        Req::Open {
            dir,
            name,
            file,
            xattrs,
        } => open(st, id, (dir, name), file, xattrs),
        Req::OpenPath { path, file } => open_path(st, id, path, file),
        Req::Read { file, offset, len } => read(st, id, file, offset, len),
        Req::ReadLink { dir, name } => {
            let t = s.read_link(&*dir_of(st, dir)?, &cname(name)?)?;
            Ok(proto::frame(id, &Resp::Bytes(&t)))
        }
        req @ Req::Put { .. } => put(st, id, req),
        req @ Req::Commit { .. } => commit(st, id, req),
        Req::CreateEmpty {
            dir,
            name,
            meta,
            fsync,
        } => {
            let made = s.create_empty(&*dir_of(st, dir)?, &cname(name)?, &meta.0, fsync)?;
            Ok(proto::frame(id, &Resp::Bool(made)))
        }
        req @ (Req::Symlink { .. }
        | Req::SetMeta { .. }
        | Req::Rename { .. }
        | Req::Rmdir { .. }
        | Req::Special { .. }
        | Req::Link { .. }) => ok(id, entry_act(st, req)),
        req @ (Req::Remove { .. } | Req::RemovePlanned { .. } | Req::RemoveEach { .. }) => {
            remove(st, id, req)
        }
        Req::MakeWritable { dir } => {
            let b = s.make_writable(&*dir_of(st, dir)?)?;
            Ok(proto::frame(id, &Resp::Bool(b)))
        }
        Req::OwnLegacyPartial { dir, name } => {
            let b = s.is_own_legacy_partial(&*dir_of(st, dir)?, &cname(name)?);
            Ok(proto::frame(id, &Resp::Bool(b)))
        }
        req @ Req::GetXattrs { .. } => get_xattrs(st, id, req),
        req @ Req::SetXattrs { .. } => ok(id, set_xattrs(st, req)),
        req @ Req::Keep { .. } => ok(id, keep(st, req)),
        req @ (Req::Sign { .. }
        | Req::DiffRead { .. }
        | Req::PatchHash { .. }
        | Req::PatchHashes { .. }) => delta_answer(st, id, req),
        Req::PatchBegin { .. }
        | Req::PatchWrite { .. }
        | Req::PatchCommit { .. }
        | Req::PatchAbort { .. }
        | Req::Close { .. }
        | Req::Diff { .. }
        | Req::PatchFrom { .. }
        | Req::Patch { .. }
        | Req::Create { .. }
        | Req::Write { .. }
        | Req::WriteAt { .. }
        | Req::SetLen { .. }
        | Req::PartOpen { .. }
        | Req::PartAttach { .. }
        | Req::PartSync { .. }
        | Req::PartRecord { .. }
        | Req::Abort { .. }
        | Req::Watch { .. }
        | Req::ListAhead { .. }
        | Req::Info
        | Req::StatRoot { .. }
        | Req::OpenDir { .. }
        | Req::OpenDirAhead { .. }
        | Req::Ping
        | Req::ReadOnly
        | Req::KeepAlive { .. } => {
            unreachable!("handled in order by the reading and disk threads")
        }
    }
}

/// `Root`: open (or make) the tree at `path` as handle `dir`, its metadata.
fn root(st: &State, id: u64, path: &[u8], dir: u64, create: bool) -> io::Result<Vec<u8>> {
    let p = &*local_path(path)?;
    let at = LocalStore::new(Path::new(OsStr::from_bytes(p)), 1).read_only(st.store.is_read_only());
    let opened = if create {
        let d = at.create_root()?;
        let m = at.open_root()?.map(|(_, m)| m);
        m.map(|m| (d, m))
    } else {
        at.open_root()?
    };
    let meta = opened.map(|(d, m)| {
        st.dirs.lock().insert(dir, Arc::new(d));
        M(m)
    });
    Ok(proto::frame(id, &Resp::Meta(meta)))
}

/// `StatPath`: the metadata of a path (`None`: there is none).
fn stat_path(id: u64, path: &[u8], follow: bool) -> io::Result<Vec<u8>> {
    let p = &*local_path(path)?;
    let m = match ferry_local::stat_path(Path::new(OsStr::from_bytes(p)), follow) {
        Ok(m) => Some(M(m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    Ok(proto::frame(id, &Resp::Meta(m)))
}

/// `Info`: whether this end runs as root, and its cores.
pub(super) fn info(st: &State, id: u64) -> Vec<u8> {
    proto::frame(
        id,
        &Resp::Info {
            root: rustix::process::geteuid().is_root(),
            cores: st.cores as u32,
        },
    )
}

/// `StatRoot`: the metadata of a path (a final symlink followed), and a
/// directory opened as handle `dir` as `Root` opens it. Run by the thread
/// that reads the requests (protocol 15), so a `List` sent right behind
/// it finds the handle.
pub(super) fn stat_root(st: &State, id: u64, path: &[u8], dir: u64) -> io::Result<Vec<u8>> {
    let (meta, opened) = match open_tree(st, path)? {
        (_, Some((d, m))) => {
            st.dirs.lock().insert(dir, Arc::new(d));
            (Some(m), true)
        }
        (m, None) => (m, false),
    };
    let meta = meta.map(M);
    Ok(proto::frame(id, &Resp::Root { meta, opened }))
}

/// An open directory and its metadata.
pub(super) type Tree = (LocalDir, Meta);

/// The tree at `path` (a final symlink followed), as `StatRoot` and the
/// listing ahead open it: its metadata (`None`: missing) and, when it is
/// a directory that could be opened, the open directory with its
/// metadata (not opened: gone since, unreadable; the client's `Root`
/// says why).
pub(super) fn open_tree(st: &State, path: &[u8]) -> io::Result<(Option<Meta>, Option<Tree>)> {
    let p = Path::new(OsStr::from_bytes(&local_path(path)?)).to_path_buf();
    let m = match ferry_local::stat_path(&p, true) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((None, None)),
        Err(e) => return Err(e),
    };
    let opened = match m.kind {
        ferry_engine::entry::Kind::Dir => LocalStore::new(&p, 1)
            .read_only(st.store.is_read_only())
            .open_root()
            .ok()
            .flatten(),
        _ => None,
    };
    Ok((Some(m), opened))
}

/// `OpenDir`: subdirectory `name` of `dir` opened as handle `new`. Run
/// by the thread that reads the requests, in their order (protocol 14),
/// so a `List` sent right behind it finds the handle.
pub(super) fn open_dir(
    st: &State,
    id: u64,
    dir: u64,
    name: &[u8],
    new: u64,
) -> io::Result<Vec<u8>> {
    open_dir_as(st, dir, name, new)?;
    ok(id, Ok(()))
}

/// Subdirectory `name` of `dir` opened and kept as handle `new`.
fn open_dir_as(st: &State, dir: u64, name: &[u8], new: u64) -> io::Result<Arc<LocalDir>> {
    let d = Arc::new(st.store.open_dir(&*dir_of(st, dir)?, &cname(name)?)?);
    st.dirs.lock().insert(new, d.clone());
    Ok(d)
}

/// `OpenDirAhead`: [`open_dir`], answered with the directory's device and
/// inode; refused (the walk then opens it itself) while this end holds a
/// quarter of its descriptors in open directories.
pub(super) fn open_dir_ahead(
    st: &State,
    id: u64,
    dir: u64,
    name: &[u8],
    new: u64,
) -> io::Result<Vec<u8>> {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let budget = *BUDGET.get_or_init(|| {
        let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        (l.current.unwrap_or(1 << 20) / 4).min(1 << 16) as usize
    });
    if st.dirs.lock().len() >= budget {
        return Err(io::Error::other(
            "too many directories open to open one ahead",
        ));
    }
    let d = open_dir_as(st, dir, name, new)?;
    // As a listing makes an entry's device and inode (`statx`), so that
    // the client's comparison is exact.
    let s = rustix::fs::statx(
        d.fd(),
        c"",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::INO,
    )?;
    let (dev, ino) = (
        rustix::fs::makedev(s.stx_dev_major, s.stx_dev_minor),
        s.stx_ino,
    );
    Ok(proto::frame(id, &Resp::DirOpened { dev, ino }))
}

/// `List`: directory `dir`'s entries (names, metadata, and the entries
/// that could not be read), listed into `listing` (reused).
pub(super) fn list(st: &State, id: u64, dir: u64, listing: &mut Listing) -> io::Result<Vec<u8>> {
    let d = dir_of(st, dir)?;
    if let Some(f) = st.ahead.take(&d, id) {
        return Ok(f);
    }
    listing_frame(st, id, &d, listing)
}

/// Every directory listed in this process, by device and inode, once per
/// listing (for the tests: a directory listed twice for one walk).
#[cfg(test)]
pub(super) static LISTINGS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The reply to a `List` of `d`, listed now into `listing` (reused).
pub(super) fn listing_frame(
    st: &State,
    id: u64,
    d: &LocalDir,
    listing: &mut Listing,
) -> io::Result<Vec<u8>> {
    #[cfg(test)]
    if let Ok(s) = rustix::fs::fstat(d.fd()) {
        LISTINGS.lock().push((s.st_dev, s.st_ino));
    }
    let mut errors = Vec::new();
    st.store.list(d, b"", listing, &mut errors)?;
    let mut names = Vec::with_capacity(listing.len() * 16);
    let mut metas = Vec::with_capacity(listing.len());
    for e in listing.entries() {
        names.extend_from_slice(listing.name(e));
        names.push(0);
        metas.push(M(e.meta));
    }
    let errs: Vec<_> = errors
        .iter()
        .map(|e| (&e.name[..], WireErr::from(&e.err)))
        .collect();
    Ok(proto::frame(
        id,
        &Resp::Listing {
            names: &names,
            metas,
            errors: errs,
        },
    ))
}

/// `Open`: a small file's bytes with its metadata, or a big one kept
/// open as handle `file` ([`keep_open`]).
fn open(st: &State, id: u64, at: (u64, &[u8]), file: u64, xattrs: u8) -> io::Result<Vec<u8>> {
    let s = &st.store;
    let r = s.open_file(&*dir_of(st, at.0)?, &cname(at.1)?)?;
    let mut x = Xattrs::new();
    if xattrs != 0 {
        s.reader_xattrs(&r, sel_of(xattrs), &mut x)?;
    }
    let size = r.current().map_or(u64::MAX, |c| c.0);
    if size > INLINE_MAX {
        return Ok(keep_open(st, id, file, r, &x));
    }
    // One byte past the size: a file that grew shows it.
    let mut data = vec![0u8; size as usize + 1];
    let n = pread_full(&r, 0, &mut data)?;
    Ok(proto::frame(
        id,
        &Resp::Opened {
            data: Some(&data[..n]),
            current: r.current(),
            ino: 0,
            sparse: false,
            xattrs: attrs(&x),
        },
    ))
}

/// `OpenPath`: the file at `path`, kept open as handle `file`.
fn open_path(st: &State, id: u64, path: &[u8], file: u64) -> io::Result<Vec<u8>> {
    let path = &*local_path(path)?;
    let p = Path::new(OsStr::from_bytes(path));
    let (dir, name) = match (p.parent(), p.file_name()) {
        (Some(d), Some(n)) => (
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            },
            n,
        ),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a file path",
            ))
        }
    };
    let at = LocalStore::new(dir, 1).read_only(st.store.is_read_only());
    let (d, _) = at
        .open_root()?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    let r = at.open_file(&d, &cname(name.as_bytes())?)?;
    Ok(keep_open(st, id, file, r, &Xattrs::new()))
}

/// `Read`: `len` bytes (a chunk at most) of open file `file` at `offset`,
/// its holes as runs of zeros where it may have some.
fn read(st: &State, id: u64, file: u64, offset: u64, len: u32) -> io::Result<Vec<u8>> {
    let (r, sparse) = st
        .readers
        .lock()
        .get(&file)
        .cloned()
        .ok_or_else(|| bad_handle(file))?;
    let len = (len as usize).min(proto::CHUNK);
    let mut data = vec![0u8; len];
    let (n, zeros) = if sparse {
        read_data(&r, offset, &mut data)?
    } else {
        (pread_full(&r, offset, &mut data)?, Vec::new())
    };
    let covered = n + zeros.iter().map(|z| z.1 as usize).sum::<usize>();
    Ok(proto::frame_sized(
        id,
        &Resp::Data {
            data: &data[..n],
            current: if covered < len { r.current() } else { None },
            zeros,
        },
        n,
    ))
}

/// `Put`: a whole small file written and committed.
fn put(st: &State, id: u64, req: Req<'_>) -> io::Result<Vec<u8>> {
    let Req::Put {
        dir,
        name,
        meta,
        fsync,
        data,
        xattrs,
        replacing,
        expect,
    } = req
    else {
        unreachable!("a Put")
    };
    let s = &st.store;
    let d = dir_of(st, dir)?;
    let mut w = s.create_file(&d, &cname(name)?, &meta.0)?;
    expecting(s, &mut w, replacing, expect);
    match s.write_from(&d, &mut w, &mut Bytes(data), data.len() as u64, None) {
        Ok(n) if n == data.len() as u64 => {
            let r = finish(s, &d, w, name, &meta.0, fsync, xattrs)?;
            Ok(proto::frame(id, &r))
        }
        Ok(_) => {
            s.abort(&d, w);
            Err(io::Error::other("short write"))
        }
        Err(e) => {
            s.abort(&d, w);
            Err(e)
        }
    }
}

/// `Commit` of a big file written (or resumed) under handle `file`.
fn commit(st: &State, id: u64, req: Req<'_>) -> io::Result<Vec<u8>> {
    let Req::Commit {
        file,
        name,
        meta,
        fsync,
        xattrs,
        replacing,
        expect,
        ..
    } = req
    else {
        unreachable!("a Commit")
    };
    let s = &st.store;
    let w = st.writers.lock().remove(&file);
    match w {
        Some(Writing::Open(d, mut w)) => {
            expecting(s, &mut w, replacing, expect);
            let r = finish(s, &d, w, name, &meta.0, fsync, xattrs)?;
            Ok(proto::frame(id, &r))
        }
        Some(Writing::Part(d, mut w, ..)) => {
            ferry_local::download::forget_record(w.fd())?;
            expecting(s, &mut w, replacing, expect);
            let r = finish(s, &d, w, name, &meta.0, fsync, xattrs)?;
            Ok(proto::frame(id, &r))
        }
        Some(Writing::Failed(e)) => Err(e),
        Some(Writing::Attached(..)) | None => Err(bad_handle(file)),
    }
}

/// The acts on one entry answered `Ok`: a symlink made, metadata set, a
/// rename, a directory removed, a special file made, a hard link.
fn entry_act(st: &State, req: Req<'_>) -> io::Result<()> {
    let s = &st.store;
    match req {
        Req::Symlink {
            dir,
            name,
            target,
            meta,
        } => s.create_symlink(&*dir_of(st, dir)?, &cname(name)?, target, &meta.0),
        Req::SetMeta {
            dir,
            name,
            meta,
            what,
        } => s.set_meta(&*dir_of(st, dir)?, &cname(name)?, &meta.0, what_of(what)),
        Req::Rename {
            from_dir,
            from,
            to_dir,
            to,
        } => s.rename(
            &*dir_of(st, from_dir)?,
            &cname(from)?,
            &*dir_of(st, to_dir)?,
            &cname(to)?,
        ),
        Req::Rmdir { dir, name } => s.rmdir(&*dir_of(st, dir)?, &cname(name)?),
        Req::Special {
            dir,
            name,
            meta,
            replace,
        } => s.create_special(&*dir_of(st, dir)?, &cname(name)?, &meta.0, replace),
        Req::Link {
            from_dir,
            from_name,
            dir,
            name,
        } => s.link(
            &*dir_of(st, from_dir)?,
            &cname(from_name)?,
            &*dir_of(st, dir)?,
            &cname(name)?,
        ),
        _ => unreachable!("an act on one entry"),
    }
}

/// The removals: one entry, one checked at the act, a tree entry by entry.
fn remove(st: &State, id: u64, req: Req<'_>) -> io::Result<Vec<u8>> {
    let s = &st.store;
    match req {
        Req::Remove { dir, name, is_dir } => {
            let n = s.remove(&*dir_of(st, dir)?, &cname(name)?, is_dir)?;
            Ok(proto::frame(id, &Resp::Count(n)))
        }
        Req::RemovePlanned { dir, name, at } => {
            // The check at the act, here: one `statx` right before the
            // unlink, as a local run makes it.
            let n = s.remove_planned(&*dir_of(st, dir)?, &cname(name)?, &at.into())?;
            Ok(proto::frame(id, &Resp::Count(n)))
        }
        Req::RemoveEach { dir, name } => {
            let mut told = Vec::new();
            s.remove_each(&*dir_of(st, dir)?, &cname(name)?, &mut |p, z| {
                told.push((p.to_vec(), z))
            })?;
            Ok(proto::frame(id, &Resp::Removed(told)))
        }
        _ => unreachable!("a removal"),
    }
}

/// `GetXattrs` of a directory or of an entry in it.
fn get_xattrs(st: &State, id: u64, req: Req<'_>) -> io::Result<Vec<u8>> {
    let Req::GetXattrs {
        dir,
        name,
        kind,
        sel,
    } = req
    else {
        unreachable!("a GetXattrs")
    };
    let mut x = Xattrs::new();
    let name = name.map(cname).transpose()?;
    st.store.get_xattrs(
        &*dir_of(st, dir)?,
        name.as_deref(),
        kind.0,
        sel_of(sel),
        &mut x,
    )?;
    Ok(proto::frame(id, &Resp::Xattrs(attrs(&x))))
}

/// `SetXattrs` of a directory or of an entry in it.
fn set_xattrs(st: &State, req: Req<'_>) -> io::Result<()> {
    let Req::SetXattrs {
        dir,
        name,
        meta,
        sel,
        want,
        have,
    } = req
    else {
        unreachable!("a SetXattrs")
    };
    let (mut w, mut h) = (Xattrs::new(), Xattrs::new());
    xattrs_of(&want, &mut w);
    if let Some(have) = &have {
        xattrs_of(have, &mut h);
    }
    let name = name.map(cname).transpose()?;
    st.store.set_xattrs(
        &*dir_of(st, dir)?,
        name.as_deref(),
        &meta.0,
        sel_of(sel),
        &w,
        have.is_some().then_some(&h),
    )
}

/// `Keep`: the local store's keep (hard link, rename, copy), for the
/// tree at `root` as the client opened it.
fn keep(st: &State, req: Req<'_>) -> io::Result<()> {
    let Req::Keep {
        dir,
        name,
        root,
        abs,
        base,
        path,
        overwrite,
        replacing,
        planned,
    } = req
    else {
        unreachable!("a Keep")
    };
    let root = &*local_path(root)?;
    let base = if abs {
        KeepBase::Abs(local_path(base)?.into_owned())
    } else {
        KeepBase::Root(base.to_vec())
    };
    let to = KeepTo {
        base: &base,
        path,
        overwrite,
        replacing,
        planned: planned.map(Planned::from),
    };
    let at =
        LocalStore::new(Path::new(OsStr::from_bytes(root)), 1).read_only(st.store.is_read_only());
    at.keep_entry(&*dir_of(st, dir)?, &cname(name)?, &to)
}

/// The delta requests answered by a worker (`serve/delta.rs`).
fn delta_answer(st: &State, id: u64, req: Req<'_>) -> io::Result<Vec<u8>> {
    match req {
        Req::Sign { dir, name, min } => delta::sign(st, id, dir, name, min),
        Req::DiffRead { file, seq } => delta::diff_read(st, id, file, seq),
        Req::PatchHash {
            dir,
            name,
            old,
            size,
            block,
            key,
            file,
        } => Ok(delta::inplace_hash(
            st,
            id,
            (dir, name, &old.0),
            size,
            block,
            &key,
            file,
        )),
        Req::PatchHashes {
            file,
            old,
            size,
            block,
            key,
        } => delta::inplace_hashes(st, id, file, old, size, block, &key),
        _ => unreachable!("a delta request"),
    }
}

/// Keep big file `r` open as handle `file`: the [`Resp::Opened`] frame
/// with its size, mtime, inode, whether it may have holes (fewer blocks
/// than its size fills) and its attributes `x`.
fn keep_open(st: &State, id: u64, file: u64, r: LocalReader, x: &Xattrs) -> Vec<u8> {
    let fd = r.as_fd().expect("a local file has a descriptor");
    let (ino, sparse) = rustix::fs::fstat(fd).map_or((0, false), |s| {
        (s.st_ino, (s.st_blocks as u64) * 512 < s.st_size as u64)
    });
    let current = r.current();
    st.readers.lock().insert(file, (Arc::new(r), sparse));
    proto::frame(
        id,
        &Resp::Opened {
            data: None,
            current,
            ino,
            sparse,
            xattrs: attrs(x),
        },
    )
}

/// Read `buf.len()` bytes at `offset` of a file that may have holes: the
/// data into the front of `buf`, and the holes met as runs of zeros
/// (offset in the range, length) for [`Resp::Data`]. Fewer bytes in all
/// only at the end of the file.
fn read_data(r: &LocalReader, offset: u64, buf: &mut [u8]) -> io::Result<(usize, Vec<(u32, u32)>)> {
    use rustix::fs::SeekFrom;
    let fd = r.as_fd().expect("a local file has a descriptor");
    let size = rustix::fs::fstat(fd)?.st_size as u64;
    let end = (offset + buf.len() as u64).min(size.max(offset));
    let (mut at, mut n, mut zeros) = (offset, 0usize, Vec::new());
    while at < end {
        let data = match rustix::fs::seek(fd, SeekFrom::Data(at)) {
            Ok(d) => d.min(end),
            Err(rustix::io::Errno::NXIO) => end,
            Err(e) => return Err(e.into()),
        };
        if data > at {
            zeros.push(((at - offset) as u32, (data - at) as u32));
            at = data;
            continue;
        }
        let hole = match rustix::fs::seek(fd, SeekFrom::Hole(at)) {
            Ok(h) => h.min(end),
            Err(rustix::io::Errno::NXIO) => end,
            Err(e) => return Err(e.into()),
        };
        let want = (hole - at) as usize;
        let k = pread_full(r, at, &mut buf[n..n + want])?;
        n += k;
        at += k as u64;
        if k < want {
            break;
        }
    }
    if at == end && end < offset + buf.len() as u64 {
        // The end of the file: a read past it shows growth.
        n += pread_full(r, end, &mut buf[n..n + 1])?;
    }
    Ok((n, zeros))
}
