//! A session's further sessions to the same host (ferry-ssh's connections
//! for big files, ferry-sftp's for many files): session `k` (0 is the
//! first) in slot `k - 1`, opened when first wanted. One copy for both.

use parking_lot::Mutex;
use std::sync::Arc;

/// The further sessions of one (slot `k - 1`: session `k`; `None`: not
/// opened yet).
pub type Extra<C> = Mutex<Vec<Option<Arc<C>>>>;

/// Session `k` of `me` (0: `me` itself), opened with `open` if it is not
/// there or is `gone`; `me` when it cannot be opened (the work goes on, on
/// fewer sessions).
pub fn nth<C>(
    me: &Arc<C>,
    extra: &Extra<C>,
    k: usize,
    gone: impl Fn(&C) -> bool,
    open: impl FnOnce() -> Option<Arc<C>>,
) -> Arc<C> {
    if k == 0 {
        return me.clone();
    }
    let mut extra = extra.lock();
    if extra.len() < k {
        extra.resize(k, None);
    }
    match &extra[k - 1] {
        Some(c) if !gone(c) => c.clone(),
        _ => match open() {
            Some(c) => {
                extra[k - 1] = Some(c.clone());
                c
            }
            None => me.clone(),
        },
    }
}

/// Session `k` (at least 1) when it is open and not `gone`.
pub fn live<C>(extra: &Extra<C>, k: usize, gone: impl Fn(&C) -> bool) -> Option<Arc<C>> {
    match extra.lock().get(k - 1) {
        Some(Some(c)) if !gone(c) => Some(c.clone()),
        _ => None,
    }
}

/// Make `c` session `k` (at least 1), unless a live one is there already
/// (one opened meanwhile is kept).
pub fn place<C>(extra: &Extra<C>, k: usize, c: Arc<C>, gone: impl Fn(&C) -> bool) {
    let mut extra = extra.lock();
    if extra.len() < k {
        extra.resize(k, None);
    }
    if !matches!(&extra[k - 1], Some(o) if !gone(o)) {
        extra[k - 1] = Some(c);
    }
}
