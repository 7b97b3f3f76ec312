//! Small files opened ahead of the reader ([`PipelineStore::open_ahead`]): the
//! `OPEN`s of a batch's files go together, and each file's first `READ`
//! as soon as its handle is there (moved on by whichever of the
//! directory's files is opened meanwhile), so a batch costs about two
//! round trips, not two per file. The size listed stands for the
//! `FSTAT` a file opened alone asks: a read that brings more or less than
//! it shows a file that changed, as the engine checks.
//!
//! [`PipelineStore::open_ahead`]: ferry_engine::store::PipelineStore::open_ahead

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::conn::{Batch, Conn};
use crate::store::join;
use crate::wire::{self as w, Req, Set};
use crate::write::Rx;

/// Bytes of small files opened ahead and not read yet, at most (their
/// data waits in memory once read).
const AHEAD_MAX: u64 = 32 << 20;

/// Bytes held by the opens ahead of this run.
static HELD: AtomicU64 = AtomicU64::new(0);

/// Where a file opened ahead is.
enum State {
    /// Its `OPEN` in flight.
    Opening(Rx),
    /// Open as the handle, its first read (`[0, len)`) in flight.
    Reading(Vec<u8>, u32, Rx),
    /// Its open or its read failed: told when it is taken.
    Failed(io::Error),
    /// Taken.
    Gone,
}

/// A file opened ahead.
pub(crate) struct Ahead {
    pub conn: Arc<Conn>,
    /// Its listed size.
    pub size: u64,
    state: State,
}

/// The files of one directory opened ahead, by name.
pub(crate) type Map = Mutex<HashMap<Vec<u8>, Ahead>>;

/// The `OPEN` for reading of `path`.
pub(crate) fn open_req(path: &[u8]) -> Req {
    Req::path(w::OPEN, path)
        .u32(w::F_READ)
        .attrs(&Set::default())
}

/// Ask for `[at, at + len)` of `handle`.
pub(crate) fn read_req(conn: &Conn, handle: &[u8], at: u64, len: u32) -> io::Result<Rx> {
    conn.start(Req::path(w::READ, handle).u64(at).u32(len))
}

impl Ahead {
    /// Once its open is answered (waited for when `wait`): its first read
    /// sent (gathered in `batch`).
    fn step(&mut self, wait: bool, batch: &mut Batch) {
        let State::Opening(rx) = &self.state else {
            return;
        };
        let r = match wait {
            true => self.conn.wait(rx),
            false => match self.conn.poll(rx) {
                Some(r) => r,
                None => return,
            },
        };
        self.state = match r.and_then(|r| r.handle()) {
            Ok(h) => {
                let len = self.conn.chunk;
                let req = Req::path(w::READ, &h).u64(0).u32(len);
                match self.conn.start_in(batch, req) {
                    Ok(rx) => State::Reading(h, len, rx),
                    Err(e) => {
                        self.conn.send(Req::path(w::CLOSE, &h));
                        State::Failed(e)
                    }
                }
            }
            Err(e) => State::Failed(e),
        };
    }

    /// The handle and its first read in flight (`len` bytes from 0).
    pub fn take(mut self) -> io::Result<(Vec<u8>, u32, Rx)> {
        self.step(true, &mut Batch::default());
        match std::mem::replace(&mut self.state, State::Gone) {
            State::Reading(h, len, rx) => Ok((h, len, rx)),
            State::Failed(e) => Err(e),
            _ => Err(io::Error::other(
                "SFTP: a file opened ahead was taken twice",
            )),
        }
    }
}

impl Drop for Ahead {
    /// Named but not read after all: closed (its open waited for).
    fn drop(&mut self) {
        HELD.fetch_sub(self.size, Ordering::Relaxed);
        self.step(true, &mut Batch::default());
        if let State::Reading(h, _, _) = &self.state {
            self.conn.send(Req::path(w::CLOSE, h));
        }
    }
}

/// Open `files` of directory `dir` (names, listed sizes) ahead, each on
/// the session `pick` gives: small ones only (one read brings them
/// whole), within [`AHEAD_MAX`].
pub(crate) fn open(
    map: &Map,
    dir: &[u8],
    files: &[(&CStr, u64)],
    chunk: u32,
    mut pick: impl FnMut() -> Arc<Conn>,
) {
    let mut m = map.lock();
    // The opens go together (one write per session).
    let mut batch = Batch::default();
    for &(name, size) in files {
        if size == 0 || size >= u64::from(chunk) {
            continue;
        }
        if HELD.fetch_add(size, Ordering::Relaxed) + size > AHEAD_MAX {
            HELD.fetch_sub(size, Ordering::Relaxed);
            return;
        }
        let conn = pick();
        let Ok(rx) = conn.start_in(&mut batch, open_req(&join(dir, name.to_bytes()))) else {
            HELD.fetch_sub(size, Ordering::Relaxed);
            return;
        };
        let a = Ahead {
            conn,
            size,
            state: State::Opening(rx),
        };
        // (A name hinted twice: the older open is closed.)
        m.insert(name.to_bytes().to_vec(), a);
    }
}

/// The file `name` if it was opened ahead, its open waited for (the
/// others whose open is answered have their first read sent meanwhile).
pub(crate) fn take(map: &Map, name: &CStr) -> Option<Ahead> {
    let mut a = map.lock().remove(name.to_bytes())?;
    let mut batch = Batch::default();
    a.step(true, &mut batch);
    for o in map.lock().values_mut() {
        o.step(false, &mut batch);
    }
    Some(a)
}
