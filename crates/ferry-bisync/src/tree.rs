//! Scan: both trees listed at once on the engine's worker pool, each kept
//! as one sorted [`Listing`] per directory: nothing is copied or flattened
//! after listing; the plan's merge walks the directories (see
//! [`crate::plan::merge`]). A key is the relative path with NUL for `/`
//! (see [`crate::journal`]): byte order of keys is the order of that walk.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::sync::{Arc, Mutex};

use ferry_engine::entry::join;
use ferry_engine::pool::Pool;
use ferry_engine::store::{is_temp_name, ListError};
use ferry_engine::{Filter, Kind, Listing, Meta, Store};

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
    /// Each listed directory's entries by the directory's relative path
    /// (`/`-separated, empty for the root), in name order, without ferry's
    /// temporaries and special files.
    pub dirs: HashMap<Vec<u8>, Listing>,
    /// Number of entries in `dirs`.
    pub count: usize,
    /// Keys of entries whose state is unknown (unreadable), with everything
    /// below them: nothing there may be judged deleted.
    pub unknown: Vec<Vec<u8>>,
    /// Special files (fifos, sockets, devices), skipped.
    pub skipped: Vec<Vec<u8>>,
    /// ferry's own temporaries (`.ferry-tmp.*`) left by a killed run: never
    /// synced, removed by the next real run.
    pub temps: Vec<(Vec<u8>, Meta)>,
}

impl Scan {
    /// The entry at `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Meta> {
        let dir = path_of(parent_key(key).unwrap_or(b""));
        let list = self.dirs.get(&dir)?;
        let name = name_of(key);
        let es = list.entries();
        es.binary_search_by(|e| list.name(e).cmp(name))
            .ok()
            .map(|i| &es[i].meta)
    }

    /// A scan holding `entries` (keys with their metadata, any order).
    pub fn of(entries: &[(Vec<u8>, Meta)]) -> Scan {
        let mut v: Vec<&(Vec<u8>, Meta)> = entries.iter().collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        let mut s = Scan::default();
        s.dirs.insert(Vec::new(), Listing::new());
        for (k, m) in v {
            let dir = path_of(parent_key(k).unwrap_or(b""));
            s.dirs.entry(dir).or_default().push(name_of(k), *m);
            if m.kind == Kind::Dir {
                s.dirs.entry(path_of(k)).or_default();
            }
            s.count += 1;
        }
        for l in s.dirs.values_mut() {
            l.sort();
        }
        s
    }
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
    temps: Mutex<Vec<(Vec<u8>, Meta)>>,
    skipped: Mutex<Vec<Vec<u8>>>,
}

impl<S: Store> Gather<S> {
    fn new(root: S::Dir) -> Self {
        Gather {
            root: Mutex::new(Some(root)),
            listed: Mutex::new(Vec::new()),
            unknown: Mutex::new(Vec::new()),
            temps: Mutex::new(Vec::new()),
            skipped: Mutex::new(Vec::new()),
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
        // Temporaries and special files are set aside here, so the
        // listing holds only what is synced.
        let odd = |e: &ferry_engine::entry::ListEntry, n: &[u8]| {
            e.meta.kind == Kind::Other || is_temp_name(n)
        };
        if list.entries().iter().any(|e| odd(e, list.name(e))) {
            for e in list.entries() {
                let name = list.name(e);
                if is_temp_name(name) {
                    let k = key_of(&join(&rel, name));
                    self.temps.lock().unwrap().push((k, e.meta));
                } else if e.meta.kind == Kind::Other {
                    self.skipped.lock().unwrap().push(key_of(&join(&rel, name)));
                }
            }
            list.retain_names(|n| !is_temp_name(n));
            list.retain(|e| e.meta.kind != Kind::Other);
        }
        let mut subs = Vec::new();
        for e in list.entries() {
            if e.meta.kind == Kind::Dir {
                subs.push(join(&rel, list.name(e)));
            }
        }
        subs.reverse();
        self.listed.lock().unwrap().push(Listed { rel, list });
        Some((Arc::new(dir), subs))
    }

    fn finish(self) -> Scan {
        let listed = self.listed.into_inner().unwrap();
        let mut scan = Scan {
            count: listed.iter().map(|l| l.list.len()).sum(),
            dirs: HashMap::with_capacity(listed.len()),
            unknown: self.unknown.into_inner().unwrap(),
            skipped: self.skipped.into_inner().unwrap(),
            temps: self.temps.into_inner().unwrap(),
        };
        for l in listed {
            scan.dirs.insert(l.rel, l.list);
        }
        scan.unknown.sort();
        scan.skipped.sort();
        scan.temps.sort_by(|x, y| x.0.cmp(&y.0));
        scan
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
    (ga.finish(), gb.finish())
}

/// Last component of a `/` path.
fn name_of_path(rel: &[u8]) -> &[u8] {
    match rel.iter().rposition(|&c| c == b'/') {
        Some(i) => &rel[i + 1..],
        None => rel,
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
