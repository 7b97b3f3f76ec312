//! The walked tree's first levels answered unasked (protocol 18): a serve
//! started with the tree the client walks (`serve --walk-ahead=PATH`, the
//! start command's second argument) answers, right after its hello and
//! before any of the client's bytes have come, what the client's first
//! flight asks: its `Info`, the tree's `StatRoot` (opened as handle 3)
//! and root `List`, and an `OpenDirAhead` and a `List` for each of the
//! root's subdirectories (256 at most), announced first
//! ([`Resp::Pushed`]: name, handle, ids), as the client would have asked
//! them behind its root's. OpenSSH lets a client send a session's input
//! only once the command has started (the session's window opens then),
//! so what the client asks reaches this end a round trip after it started:
//! these answers are on their way back by then. The client's own `Info`,
//! `StatRoot` and `List` of the first flight (ids [`FIRST_STAT`],
//! [`FIRST_LIST`], the `Info`'s) are then not answered again
//! ([`State::pushed`]).
//!
//! The answers are the ones those requests get (the same functions, in
//! the same order: a directory's open before its listing, the listings
//! made ahead taken under their rules), only sooner; the client takes
//! them under the rules of its first flight (the identity the parent's
//! listing names, at most 3 s old).

use super::*;
use crate::proto::{FIRST_DIR, FIRST_DIRS, FIRST_LIST, FIRST_PING, FIRST_STAT, INFO_ID};

/// Answer the first flight of a walk of `path` unasked, in order: the
/// announcement, the `Info`, the root's `StatRoot` and `List` here, before
/// anything the client asks is read (the client reads them before any
/// other answer); its subdirectories' opens and listings on a thread.
pub(super) fn push(st: &Arc<State>, path: &[u8]) {
    let send = |f: Vec<u8>| {
        let _ = st.out.lock().send(f.into());
    };
    let mut listing = Listing::new();
    let stat = answer::stat_root(st, FIRST_STAT, path, FIRST_DIR)
        .unwrap_or_else(|e| err_frame(FIRST_STAT, &e));
    let list = answer::list(st, FIRST_LIST, FIRST_DIR, &mut listing);
    let mut dirs = Vec::new();
    if list.is_ok() {
        let mut next = FIRST_PING + 1;
        for e in listing.entries() {
            if dirs.len() >= FIRST_DIRS {
                break;
            }
            if e.meta.kind != ferry_engine::entry::Kind::Dir {
                continue;
            }
            dirs.push((listing.name(e).to_vec(), next, next + 1, next + 2));
            next += 3;
        }
    }
    let listed = list.is_ok();
    // The announcement, then the `Info` (which the client reads first
    // after it), then the answers.
    send(proto::frame(0, &Resp::Pushed(dirs.clone())));
    send(answer::info(st, INFO_ID));
    send(stat);
    send(list.unwrap_or_else(|e| err_frame(FIRST_LIST, &e)));
    // The deeper levels listed meanwhile on threads of their own: the
    // listing ahead the client asks for with its hello (`ListAhead`, then
    // not started again), from the root's subdirectories on (the root
    // is listed; a second listing of a root of 500,000 files would double
    // this end's work).
    if listed {
        if let Ok(root) = dir_of(st, FIRST_DIR) {
            ahead::Ahead::start_below(st, root, &listing);
        }
    }
    if dirs.is_empty() {
        return;
    }
    // Each directory opened, then listed, on one of a few threads (as the
    // client's requests would be, by the workers).
    let dirs = Arc::new(dirs);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..st.cores.clamp(2, THREADS) {
        let (st, dirs, next) = (st.clone(), dirs.clone(), next.clone());
        std::thread::spawn(move || {
            let mut listing = Listing::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, handle, open_id, list_id)) = dirs.get(i) else {
                    return;
                };
                let opened = answer::open_dir_ahead(&st, *open_id, FIRST_DIR, name, *handle)
                    .unwrap_or_else(|e| err_frame(*open_id, &e));
                let _ = st.out.lock().send(opened.into());
                let list = answer::list(&st, *list_id, *handle, &mut listing)
                    .unwrap_or_else(|e| err_frame(*list_id, &e));
                let _ = st.out.lock().send(list.into());
            }
        });
    }
}

/// Threads opening and listing the root's subdirectories at most.
const THREADS: usize = 8;
