//! Scan: both trees listed at once on the engine's worker pool, each
//! flattened into a [`Keyed`] list in key order (see [`crate::journal`]:
//! a key is the relative path with NUL for `/`).
//!
//! Listing threads only list (getdents64 + statx in the local store); the
//! flattening runs once both scans are done and costs one pass over the
//! entries with no per-entry allocation.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::sync::{Arc, Mutex};

use ferry_engine::entry::join;
use ferry_engine::pool::Pool;
use ferry_engine::store::{is_temp_name, ListError};
use ferry_engine::{Filter, Kind, Listing, Meta, Store};

/// Values in key order, keys in one arena.
#[derive(Debug)]
pub struct Keyed<T> {
    arena: Vec<u8>,
    ents: Vec<(u32, u32, T)>,
}

impl<T> Default for Keyed<T> {
    fn default() -> Self {
        Keyed {
            arena: Vec::new(),
            ents: Vec::new(),
        }
    }
}

impl<T> Keyed<T> {
    /// Append (keys must come in order).
    pub fn push(&mut self, key: &[u8], v: T) {
        let off = self.arena.len() as u32;
        self.arena.extend_from_slice(key);
        self.ents.push((off, key.len() as u32, v));
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.ents.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.ents.is_empty()
    }

    /// Key of entry `i`.
    pub fn key(&self, i: usize) -> &[u8] {
        let (o, l, _) = self.ents[i];
        &self.arena[o as usize..(o + l) as usize]
    }

    /// Value of entry `i`.
    pub fn value(&self, i: usize) -> &T {
        &self.ents[i].2
    }

    /// The value under `key`, by binary search.
    pub fn get(&self, key: &[u8]) -> Option<&T> {
        self.ents
            .binary_search_by(|(o, l, _)| self.arena[*o as usize..(*o + *l) as usize].cmp(key))
            .ok()
            .map(|i| &self.ents[i].2)
    }
}

/// Key of a relative path (`/` → NUL).
pub fn key_of(path: &[u8]) -> Vec<u8> {
    path.iter()
        .map(|&c| if c == b'/' { 0 } else { c })
        .collect()
}

/// Relative path of a key (NUL → `/`).
pub fn path_of(key: &[u8]) -> Vec<u8> {
    key.iter().map(|&c| if c == 0 { b'/' } else { c }).collect()
}

/// The key of the parent directory (`None` at the top level).
pub fn parent_key(key: &[u8]) -> Option<&[u8]> {
    key.iter().rposition(|&c| c == 0).map(|i| &key[..i])
}

/// The last component of a key.
pub fn name_of(key: &[u8]) -> &[u8] {
    match key.iter().rposition(|&c| c == 0) {
        Some(i) => &key[i + 1..],
        None => key,
    }
}

/// A scanned tree.
#[derive(Debug, Default)]
pub struct Scan {
    /// Every entry (the root not included), in key order.
    pub entries: Keyed<Meta>,
    /// Keys of entries whose state is unknown (unreadable), with everything
    /// below them: nothing there may be judged deleted.
    pub unknown: Vec<Vec<u8>>,
    /// Special files (fifos, sockets, devices), skipped.
    pub skipped: Vec<Vec<u8>>,
    /// ferry's own temporaries (`.ferry-tmp.*`) left by a killed run: never
    /// synced, removed by the next real run.
    pub temps: Vec<(Vec<u8>, Meta)>,
}

enum DirTask<A: Store, B: Store> {
    A(Vec<u8>, Option<Arc<A::Dir>>),
    B(Vec<u8>, Option<Arc<B::Dir>>),
}

/// The outcome of listing one directory.
struct Listed {
    rel: Vec<u8>,
    list: Listing,
}

/// Reports a path that could not be listed or read.
pub type OnError<'a> = &'a (dyn Fn(&[u8], &io::Error) + Sync);

/// A listed directory, kept open for its subdirectories, and their paths.
type Opened<D> = (Arc<D>, Vec<Vec<u8>>);

/// What one side's scan gathers.
struct Gather<S: Store> {
    root: Mutex<Option<S::Dir>>,
    listed: Mutex<Vec<Listed>>,
    unknown: Mutex<Vec<Vec<u8>>>,
}

impl<S: Store> Gather<S> {
    fn new(root: S::Dir) -> Self {
        Gather {
            root: Mutex::new(Some(root)),
            listed: Mutex::new(Vec::new()),
            unknown: Mutex::new(Vec::new()),
        }
    }

    /// List one directory; returns it and the subdirectories to list.
    fn list(
        &self,
        store: &S,
        rel: Vec<u8>,
        parent: Option<Arc<S::Dir>>,
        filter: Option<&Filter>,
        on_error: OnError<'_>,
    ) -> Option<Opened<S::Dir>> {
        let dir = match &parent {
            None => self.root.lock().unwrap().take().expect("root once"),
            Some(p) => {
                let name = CString::new(name_of_path(&rel)).expect("names hold no NUL");
                match store.open_dir(p, &name) {
                    Ok(d) => d,
                    Err(e) => {
                        on_error(&rel, &e);
                        self.unknown.lock().unwrap().push(key_of(&rel));
                        return None;
                    }
                }
            }
        };
        let mut list = Listing::new();
        let mut errors: Vec<ListError> = Vec::new();
        if let Err(e) = store.list(&dir, &rel, filter, &mut list, &mut errors) {
            on_error(&rel, &e);
            self.unknown.lock().unwrap().push(key_of(&rel));
            return None;
        }
        for e in &errors {
            let p = join(&rel, &e.name);
            on_error(&p, &e.err);
            self.unknown.lock().unwrap().push(key_of(&p));
        }
        let mut subs = Vec::new();
        for e in list.entries() {
            if e.meta.kind == Kind::Dir && !is_temp_name(list.name(e)) {
                subs.push(join(&rel, list.name(e)));
            }
        }
        subs.reverse();
        self.listed.lock().unwrap().push(Listed { rel, list });
        Some((Arc::new(dir), subs))
    }

    fn finish(self) -> Scan {
        flatten(
            self.listed.into_inner().unwrap(),
            self.unknown.into_inner().unwrap(),
        )
    }
}

/// List two stores at once on one pool of `jobs` workers, each directory a
/// task (the roots must exist). Per-entry errors are reported through
/// `on_error` and make their keys unknown.
pub fn scan_pair<A: Store, B: Store>(
    a: (&A, A::Dir),
    b: (&B, B::Dir),
    jobs: usize,
    filter: Option<&Filter>,
    on_error: OnError<'_>,
) -> (Scan, Scan) {
    let ga = Gather::<A>::new(a.1);
    let gb = Gather::<B>::new(b.1);
    let pool: Pool<DirTask<A, B>> = Pool::new();
    pool.push_all([DirTask::B(Vec::new(), None), DirTask::A(Vec::new(), None)]);
    pool.run(jobs.max(2), |t, pool| match t {
        DirTask::A(rel, parent) => {
            if let Some((d, subs)) = ga.list(a.0, rel, parent, filter, on_error) {
                pool.push_all(subs.into_iter().map(|r| DirTask::A(r, Some(d.clone()))));
            }
        }
        DirTask::B(rel, parent) => {
            if let Some((d, subs)) = gb.list(b.0, rel, parent, filter, on_error) {
                pool.push_all(subs.into_iter().map(|r| DirTask::B(r, Some(d.clone()))));
            }
        }
    });
    // Both flattenings at once (one pass each over its side's entries).
    std::thread::scope(|s| {
        let hb = s.spawn(|| gb.finish());
        let sa = ga.finish();
        (sa, hb.join().expect("flatten thread"))
    })
}

/// Last component of a `/` path.
fn name_of_path(rel: &[u8]) -> &[u8] {
    match rel.iter().rposition(|&c| c == b'/') {
        Some(i) => &rel[i + 1..],
        None => rel,
    }
}

/// Assemble per-directory listings into one list in key order: a
/// depth-first walk with each directory's entries in name order.
fn flatten(listed: Vec<Listed>, mut unknown: Vec<Vec<u8>>) -> Scan {
    let total: usize = listed.iter().map(|l| l.list.len()).sum();
    let mut by_dir: HashMap<Vec<u8>, Listing> = HashMap::with_capacity(listed.len());
    for l in listed {
        by_dir.insert(l.rel, l.list);
    }
    let mut scan = Scan::default();
    scan.entries.ents.reserve(total);
    let mut key = Vec::new();
    let mut path = Vec::new();
    walk(&by_dir, &mut path, &mut key, &mut scan);
    unknown.sort();
    scan.unknown = unknown;
    scan
}

fn walk(
    by_dir: &HashMap<Vec<u8>, Listing>,
    path: &mut Vec<u8>,
    key: &mut Vec<u8>,
    scan: &mut Scan,
) {
    let Some(list) = by_dir.get(path.as_slice()) else {
        return;
    };
    for e in list.entries() {
        let name = list.name(e);
        let (pl, kl) = (path.len(), key.len());
        if pl > 0 {
            path.push(b'/');
            key.push(0);
        }
        path.extend_from_slice(name);
        key.extend_from_slice(name);
        if is_temp_name(name) {
            scan.temps.push((key.clone(), e.meta));
        } else if e.meta.kind == Kind::Other {
            scan.skipped.push(key.clone());
        } else {
            scan.entries.push(key, e.meta);
            if e.meta.kind == Kind::Dir {
                walk(by_dir, path, key, scan);
            }
        }
        path.truncate(pl);
        key.truncate(kl);
    }
}

/// True when `key` is one of `prefixes` (sorted) or below one.
pub fn under_any(prefixes: &[Vec<u8>], key: &[u8]) -> bool {
    prefixes.iter().any(|p| {
        key == p.as_slice() || (key.len() > p.len() && key.starts_with(p) && key[p.len()] == 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_like_a_walk() {
        let mut v = [
            key_of(b"a.b"),
            key_of(b"a/x"),
            key_of(b"a"),
            key_of(b"a/x/y"),
            key_of(b"a-"),
        ];
        v.sort();
        let p: Vec<Vec<u8>> = v.iter().map(|k| path_of(k)).collect();
        assert_eq!(
            p,
            vec![
                b"a".to_vec(),
                b"a/x".to_vec(),
                b"a/x/y".to_vec(),
                b"a-".to_vec(),
                b"a.b".to_vec()
            ]
        );
        assert_eq!(parent_key(&key_of(b"a/x/y")), Some(&key_of(b"a/x")[..]));
        assert_eq!(name_of(&key_of(b"a/x/y")), b"y");
        assert!(under_any(&[key_of(b"a/x")], &key_of(b"a/x/y")));
        assert!(!under_any(&[key_of(b"a/x")], &key_of(b"a/xy")));
    }
}
