//! `ferry serve`'s disk thread: the requests of big files being written
//! (creation, chunks, commits, aborts, partial files that resume, delta
//! patches), carried out in the order they came.

use super::*;

/// The disk thread: big files' creation, writes, commits and aborts, in
/// the order they came.
pub(super) fn write_files(st: &State, rx: &Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let (id, body) = match job {
            Job::Msg(id, body) => (id, body),
            Job::Chunk(c) => {
                write_at(st, c.file, c.data(), c.offset, true);
                let mut bufs = st.bufs.lock();
                if bufs.len() < DISK_QUEUE + 2 {
                    bufs.push(c.buf);
                }
                continue;
            }
        };
        let req = match proto::decode::<Req>(&body) {
            Ok(r) => r,
            Err(e) => {
                if id != 0 {
                    let _ = st.out.lock().send(err_frame(id, &e).into());
                }
                continue;
            }
        };
        match req {
            Req::Create {
                dir,
                name,
                meta,
                file,
            } => {
                let w = match dir_of(st, dir).and_then(|d| {
                    let w = st.store.create_file(&d, &cname(name)?, &meta.0)?;
                    Ok(Writing::Open(d, w))
                }) {
                    Ok(w) => w,
                    Err(e) => Writing::Failed(e),
                };
                st.writers.lock().insert(file, w);
            }
            Req::Write { file, data } => write_chunk(st, file, data),
            Req::WriteAt { file, offset, data } => write_at(st, file, data, offset, false),
            Req::SetLen { file, size } => {
                on_writer(st, file, |fd| Ok(rustix::fs::ftruncate(fd, size)?))
            }
            Req::PatchFrom {
                dir,
                file,
                old,
                block,
                size,
            } => delta::patch_from(st, dir, file, old, block, size),
            Req::Patch { file, ops } => delta::patch(st, file, ops),
            Req::PatchBegin {
                file,
                changed,
                hashes,
            } => delta::inplace_begin(st, file, &changed, &hashes),
            Req::PatchWrite { file, at, data } => delta::inplace_write(st, file, at, data),
            Req::PatchCommit {
                file,
                root,
                meta,
                fsync,
            } => {
                let f = delta::inplace_commit(st, id, file, &root, &meta.0, fsync);
                let _ = st.out.lock().send(f.into());
            }
            Req::PatchAbort { file } => delta::inplace_abort(st, file),
            Req::Commit { file, .. } if st.deltas.unfinished(file) => {
                if let Some(Writing::Open(d, w)) = st.writers.lock().remove(&file) {
                    st.store.abort(&d, w);
                }
                let e = io::Error::new(
                    io::ErrorKind::InvalidData,
                    "delta: the ops stopped before their end",
                );
                let _ = st.out.lock().send(err_frame(id, &e).into());
            }
            Req::Abort { file, .. } => {
                st.deltas.drop_handle(file);
                let w = st.writers.lock().remove(&file);
                if let Some(w) = w {
                    w.discard(&st.store);
                }
            }
            req @ (Req::PartOpen { .. }
            | Req::PartAttach { .. }
            | Req::PartSync { .. }
            | Req::PartRecord { .. }) => part_request(st, id, req),
            req => {
                let f = answer(st, id, req, &mut Listing::new());
                let _ = st.out.lock().send(f.into());
            }
        }
    }
}

/// The requests of a partial file (a big push that resumes): open one
/// with the ranges it holds, attach to one by path, sync or close it,
/// record what it holds.
fn part_request(st: &State, id: u64, req: Req<'_>) {
    match req {
        Req::PartOpen {
            dir,
            name,
            meta,
            ident,
            file,
        } => {
            let r = dir_of(st, dir).and_then(|d| {
                let (w, done) = st.store.partial_writer(&d, &cname(name)?, &meta.0, ident)?;
                let direct = Direct::reopen(w.fd());
                let part = Writing::Part(d, w, meta.0.size, ident.to_owned(), direct);
                Ok((part, done))
            });
            let f = match r {
                Ok((w, done)) => {
                    st.writers.lock().insert(file, w);
                    proto::frame(id, &Resp::Ranges(done.ranges()))
                }
                Err(e) => err_frame(id, &e),
            };
            let _ = st.out.lock().send(f.into());
        }
        Req::PartAttach { path, file } => {
            let path = match local_path(path) {
                Ok(p) => p,
                Err(e) => {
                    st.writers.lock().insert(file, Writing::Failed(e));
                    return;
                }
            };
            let w = rustix::fs::open(
                OsStr::from_bytes(&path),
                rustix::fs::OFlags::WRONLY
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_or_else(
                |e| Writing::Failed(e.into()),
                |fd| {
                    let direct = Direct::reopen(fd.as_fd());
                    Writing::Attached(fd, direct, path.to_vec())
                },
            );
            st.writers.lock().insert(file, w);
        }
        Req::PartSync { file, flush, close } => {
            let r = {
                let mut ws = st.writers.lock();
                let r = match ws.get(&file) {
                    Some(Writing::Failed(e)) => Err(match e.raw_os_error() {
                        Some(n) => io::Error::from_raw_os_error(n),
                        None => io::Error::new(e.kind(), e.to_string()),
                    }),
                    Some(w) => match (flush, w.fd()) {
                        (true, Some(fd)) => rustix::fs::fdatasync(fd).map_err(io::Error::from),
                        _ => Ok(()),
                    },
                    None => Err(bad_handle(file)),
                };
                if close {
                    ws.remove(&file);
                }
                r
            };
            let f = match r {
                Ok(()) => proto::frame(id, &Resp::Ok),
                Err(e) => err_frame(id, &e),
            };
            let _ = st.out.lock().send(f.into());
        }
        Req::PartRecord { file, ranges } => {
            let ws = st.writers.lock();
            if let Some(Writing::Part(_, w, size, ident, _)) = ws.get(&file) {
                let mut set = ferry_local::range::RangeSet::new();
                for (a, b) in ranges {
                    set.insert(a, b);
                }
                // Best effort: a record not made costs a resend.
                let _ = ferry_local::download::record(w.fd(), *size, ident, &set);
            }
        }
        _ => unreachable!("a partial file's request"),
    }
}

/// Append `data` to the file being written as `file`; a failure is kept
/// for its commit.
fn write_chunk(st: &State, file: u64, data: &[u8]) {
    let mut ws = st.writers.lock();
    let Some(slot) = ws.get_mut(&file) else {
        return;
    };
    let Writing::Open(dir, w) = slot else {
        return;
    };
    let r = st
        .store
        .write_from(dir, w, &mut Bytes(data), data.len() as u64, None)
        .and_then(|n| {
            if n == data.len() as u64 {
                Ok(())
            } else {
                Err(io::Error::other("short write"))
            }
        });
    if let Err(e) = r {
        if let Some(Writing::Open(d, w)) = ws.insert(file, Writing::Failed(e)) {
            st.store.abort(&d, w);
        }
    }
}

/// Write `data` at `offset` of the file being written as `file`: a big
/// file's through its `O_DIRECT` descriptor (from where `data` is when it
/// is `aligned` as its offset is, else through an aligned copy).
fn write_at(st: &State, file: u64, data: &[u8], offset: u64, aligned: bool) {
    let mut ws = st.writers.lock();
    let direct = |direct: &Direct, fd: BorrowedFd<'_>| match aligned {
        true => direct.write(fd, data, offset),
        false => direct.write_copied(fd, data, offset),
    };
    let r = match ws.get(&file) {
        Some(Writing::Part(_, w, _, _, d)) => direct(d, w.fd()),
        Some(Writing::Attached(fd, d, _)) => direct(d, fd.as_fd()),
        Some(Writing::Open(_, w)) => pwrite_all(w.fd(), data, offset),
        Some(Writing::Failed(_)) | None => return,
    };
    if let Err(e) = r {
        let full = ferry_engine::store::is_no_space(&e);
        if let Some(w) = ws.insert(file, Writing::Failed(e)) {
            w.fail(&st.store, full);
        }
    }
}

/// Do `f` to the file being written as `file`; a failure is kept for its
/// commit.
pub(super) fn on_writer(st: &State, file: u64, f: impl FnOnce(BorrowedFd<'_>) -> io::Result<()>) {
    let mut ws = st.writers.lock();
    let Some(fd) = ws.get(&file).and_then(Writing::fd) else {
        return;
    };
    if let Err(e) = f(fd) {
        let full = ferry_engine::store::is_no_space(&e);
        if let Some(w) = ws.insert(file, Writing::Failed(e)) {
            w.fail(&st.store, full);
        }
    }
}

fn pwrite_all(fd: std::os::fd::BorrowedFd<'_>, data: &[u8], at: u64) -> io::Result<()> {
    let mut n = 0;
    while n < data.len() {
        match rustix::io::pwrite(fd, &data[n..], at + n as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Tell the local store what the commit of `w` may replace, as the client
/// said it ([`Req::Put`], [`Req::Commit`]): checked right before the
/// rename, here.
pub(super) fn expecting(
    s: &LocalStore,
    w: &mut LocalWriter,
    replacing: bool,
    expect: proto::Expect,
) {
    match expect {
        Some(at) => s.expect(w, at.map(Planned::from).as_ref()),
        None if replacing => s.replacing(w),
        None => {}
    }
}

/// Give the file being written its attributes and commit it: the reply
/// [`Req::Commit`] and [`Req::Put`] describe (`Ok`, or `Bool(false)`).
pub(super) fn finish(
    s: &LocalStore,
    d: &LocalDir,
    mut w: LocalWriter,
    name: &[u8],
    meta: &Meta,
    fsync: bool,
    xattrs: Option<(u8, Attrs<'_>)>,
) -> io::Result<Resp<'static>> {
    let name = match cname(name) {
        Ok(n) => n,
        Err(e) => {
            s.abort(d, w);
            return Err(e);
        }
    };
    let mut kept = true;
    if let Some((sel, a)) = xattrs {
        let mut want = Xattrs::new();
        xattrs_of(&a, &mut want);
        match s.set_writer_xattrs(d, &mut w, meta, sel_of(sel), &want) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Unsupported => kept = false,
            Err(e) => {
                s.abort(d, w);
                return Err(e);
            }
        }
    }
    s.commit(d, w, &name, meta, fsync)?;
    Ok(if kept { Resp::Ok } else { Resp::Bool(false) })
}
