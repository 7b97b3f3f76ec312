//! `ferry ls`: list a tree recursively on the worker pool, printing each
//! directory's sorted entries as one block (one write per block).
//!
//! Output lines: `SIZE MTIME_NS PATH` (directories end with `/`, symlinks
//! show `-> TARGET`), or one JSON object per entry. Names are written by
//! [`crate::encode`]: escaped in text, losslessly in JSON.

use parking_lot::Mutex;
use std::ffi::CString;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::encode::{json_name, text_name};
use crate::entry::{join, Kind, Listing, Meta};
use crate::filter::Filter;
use crate::store::{ListError, Store, StoreExt};
use crate::walk::{self, Queue, Visitor};

/// Output format of `ls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `SIZE MTIME_NS PATH`
    Text,
    /// One JSON object per line.
    Json,
}

/// Directories with more entries than this are formatted by several threads.
const PARALLEL_FORMAT_MIN: usize = 16384;

struct Dir<S: Store> {
    rel: Vec<u8>,
    dir: S::Dir,
}

enum Task<S: Store> {
    Root,
    Sub { parent: Arc<Dir<S>>, name: CString },
}

/// `ls` as a walk of one store.
struct Ls<'a, S: Store, W: Write + Send> {
    store: &'a S,
    jobs: usize,
    filter: Option<&'a Filter>,
    format: Format,
    out: &'a Mutex<W>,
    on_error: &'a (dyn Fn(&[u8], &io::Error) + Sync),
    root: Mutex<Option<S::Dir>>,
    exact: bool,
    count: AtomicU64,
    write_err: Mutex<Option<io::Error>>,
}

impl<S: Store, W: Write + Send> Visitor for Ls<'_, S, W> {
    type Dir = Task<S>;
    type Work = ();

    fn dir(&self, task: Task<S>, q: &Queue<'_, Task<S>, ()>) {
        let store = self.store;
        let dir = match task {
            Task::Root => Arc::new(Dir {
                rel: Vec::new(),
                dir: self.root.lock().take().expect("root once"),
            }),
            Task::Sub { parent, name } => {
                let rel = join(&parent.rel, name.to_bytes());
                // Listed next: its listing asked with its open (one round
                // trip on a link, not two).
                match store.open_dir_to_list(&parent.dir, &name) {
                    Ok(d) => Arc::new(Dir { rel, dir: d }),
                    Err(e) => return (self.on_error)(&rel, &e),
                }
            }
        };
        let mut list = Listing::new();
        let mut entry_err = |path: Vec<u8>, e: ListError| (self.on_error)(&path, &e.err);
        if let Err(e) = walk::list(
            store,
            &dir.dir,
            &dir.rel,
            self.filter,
            &mut list,
            &mut entry_err,
        ) {
            return (self.on_error)(&dir.rel, &e);
        }
        self.count.fetch_add(list.len() as u64, Ordering::Relaxed);
        let mut subdirs = Vec::new();
        for e in list.entries() {
            if e.meta.kind == Kind::Dir {
                subdirs.push(Task::Sub {
                    parent: dir.clone(),
                    name: list.cname(e).to_owned(),
                });
            }
        }
        let format_part = |part: &[crate::entry::ListEntry]| {
            let mut buf = Vec::with_capacity(part.len() * 48);
            for e in part {
                let target = if e.meta.kind == Kind::Symlink {
                    store.read_link(&dir.dir, list.cname(e)).ok()
                } else {
                    None
                };
                format_entry(
                    &mut buf,
                    self.format,
                    &dir.rel,
                    list.name(e),
                    &e.meta,
                    target.as_deref(),
                    self.exact,
                );
            }
            buf
        };
        // A huge directory is formatted by several threads, in order.
        let entries = list.entries();
        let jobs = self.jobs;
        let parts: Vec<Vec<u8>> = if entries.len() >= PARALLEL_FORMAT_MIN && jobs > 1 {
            let chunk = entries.len().div_ceil(jobs);
            std::thread::scope(|s| {
                let handles: Vec<_> = entries
                    .chunks(chunk)
                    .map(|p| s.spawn(move || format_part(p)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("format thread panicked"))
                    .collect()
            })
        } else {
            vec![format_part(entries)]
        };
        if parts.iter().any(|p| !p.is_empty()) {
            let mut w = self.out.lock();
            if let Err(e) = parts.iter().try_for_each(|p| w.write_all(p)) {
                drop(w);
                *self.write_err.lock() = Some(e);
                q.stop();
                return;
            }
        }
        q.dirs(subdirs);
    }

    fn work(&self, (): (), _: &Queue<'_, Task<S>, ()>) {}
}

/// List the whole tree of `store` to `out`. Per-entry errors go to `on_error`
/// (path, error); returns the number of entries listed.
pub fn list_tree<S: Store, W: Write + Send>(
    store: &S,
    jobs: usize,
    filter: Option<&Filter>,
    format: Format,
    out: &Mutex<W>,
    on_error: &(dyn Fn(&[u8], &io::Error) + Sync),
) -> io::Result<u64> {
    let (root, _) = store
        .open_root()?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    let ls = Ls {
        store,
        jobs,
        filter,
        format,
        out,
        on_error,
        root: Mutex::new(Some(root)),
        exact: !store.features().approximate_meta,
        count: AtomicU64::new(0),
        write_err: Mutex::new(None),
    };
    walk::walk(&ls, jobs, vec![Task::Root]);
    if let Some(e) = ls.write_err.into_inner() {
        return Err(e);
    }
    Ok(ls.count.into_inner())
}

/// Append one entry's line to `buf`. `exact`: false when the metadata is
/// what a listing gives (`Features::approximate_meta`: S3 without a HEAD per
/// object), whose mode is unknown and not printed.
pub fn format_entry(
    buf: &mut Vec<u8>,
    format: Format,
    dir: &[u8],
    name: &[u8],
    m: &Meta,
    target: Option<&[u8]>,
    exact: bool,
) {
    match format {
        Format::Text => {
            let _ = write!(buf, "{} {} ", m.size, m.mtime_ns());
            if !dir.is_empty() {
                text_name(buf, dir);
                buf.push(b'/');
            }
            text_name(buf, name);
            if m.kind == Kind::Dir {
                buf.push(b'/');
            }
            if let Some(t) = target {
                buf.extend_from_slice(b" -> ");
                text_name(buf, t);
            }
            buf.push(b'\n');
        }
        Format::Json => {
            buf.push(b'{');
            json_name(buf, "path", &join(dir, name));
            let _ = write!(
                buf,
                ",\"kind\":\"{}\",\"size\":{},\"mtime_ns\":{}",
                m.kind.as_str(),
                m.size,
                m.mtime_ns(),
            );
            if exact {
                let _ = write!(buf, ",\"mode\":{}", m.mode);
            }
            if let Some(t) = target {
                buf.push(b',');
                json_name(buf, "target", t);
            }
            buf.extend_from_slice(b"}\n");
        }
    }
}
