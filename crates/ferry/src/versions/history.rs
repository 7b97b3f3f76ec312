//! One file's history in its replica (its versions and the file now),
//! and what PATH names there: a file, a directory, or neither.

use super::*;

/// Open the live directory `dir` below the root (creating what is
/// missing with `create`); `None` when it does not exist.
pub(super) fn live_dir(
    store: &AnyStore,
    root: AnyDir,
    dir: &[u8],
    create: bool,
) -> io::Result<Option<AnyDir>> {
    let mut d = root;
    for part in dir.split(|&c| c == b'/').filter(|p| !p.is_empty()) {
        let name = cstr(part)?;
        d = match store.open_dir(&d, &name) {
            Ok(x) => x,
            Err(e) if missing(&e) && create => store.make_dir(&d, &name)?,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
    }
    Ok(Some(d))
}

/// One file's history in its replica: its kept versions, oldest first,
/// and the file as it is now (`None`: deleted).
pub(super) struct History {
    pub(super) rel: Vec<u8>,
    pub(super) live: Option<Meta>,
    pub(super) versions: Vec<Version>,
    /// The backup directory's root, when some versions are backups.
    pub(super) broot: Option<Root>,
    /// The states' spans, once asked for.
    pub(super) sp: std::cell::OnceCell<Vec<ferry_engine::versions::Span>>,
}

/// Which state of a file a restore or a listing takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pick {
    /// The current file.
    Live,
    /// `versions[i]`.
    Version(usize),
}

impl History {
    /// (mtime, time kept) of each state, oldest first, the current file
    /// last ([`ferry_engine::versions::spans`]).
    pub(super) fn states(&self) -> Vec<(i64, Option<i64>)> {
        let mut v: Vec<(i64, Option<i64>)> = self
            .versions
            .iter()
            .map(|v| (v.meta.mtime_sec, Some(v.kept)))
            .collect();
        if let Some(m) = &self.live {
            v.push((m.mtime_sec, None));
        }
        v
    }

    /// The state the file had at `at` (`None`: it did not exist then, as
    /// far as the history tells); without a time, the newest version.
    pub(super) fn pick(&self, at: Option<i64>) -> Option<Pick> {
        let Some(at) = at else {
            return self.versions.len().checked_sub(1).map(Pick::Version);
        };
        let i = state_at(&self.states(), at)?;
        Some(if i == self.versions.len() {
            Pick::Live
        } else {
            Pick::Version(i)
        })
    }

    /// When the state `p` was written (its span's start).
    pub(super) fn written(&self, p: Pick) -> i64 {
        let sp = self.sp.get_or_init(|| spans(&self.states()));
        match p {
            Pick::Live => sp.last().map_or(0, |s| s.start),
            Pick::Version(i) => sp[i].start,
        }
    }

    /// Where the state `p` is, as raw bytes (`root`: the replica's).
    pub(super) fn where_bytes(&self, root: &Root, p: Pick) -> Vec<u8> {
        match p {
            Pick::Live => root.location(&self.rel),
            Pick::Version(i) => {
                let v = &self.versions[i];
                match (&self.broot, v.backup) {
                    (Some(b), true) => b.location(&v.path()),
                    _ => root.location(&v.path()),
                }
            }
        }
    }

    /// [`History::where_bytes`] as text.
    pub(super) fn where_text(&self, root: &Root, p: Pick) -> String {
        text_name_string(&self.where_bytes(root, p))
    }

    pub(super) fn meta(&self, p: Pick) -> Meta {
        match p {
            Pick::Live => self.live.expect("a live pick has a live file"),
            Pick::Version(i) => self.versions[i].meta,
        }
    }
}

/// What PATH names in its replica.
pub(super) enum Target {
    /// A file.
    File(History),
    /// A directory (`rel` below the root): every file below it that
    /// exists or has versions, by path.
    Dir {
        rel: Vec<u8>,
        files: BTreeMap<Vec<u8>, History>,
    },
}

pub(super) fn open_root(store: &AnyStore) -> io::Result<AnyDir> {
    match store.open_root()? {
        Some((d, _)) => Ok(d),
        None => Err(io::Error::from(io::ErrorKind::NotFound)),
    }
}

/// Every file and symlink below the live directory `d` (at `rel`),
/// leaving out `.ferry-versions` at any depth; problems go to `notes`.
pub(super) fn live_files(
    store: &AnyStore,
    d: &AnyDir,
    rel: &[u8],
    out: &mut Vec<(Vec<u8>, Meta)>,
    notes: &mut Vec<String>,
) {
    let mut l = Listing::new();
    let mut errors = Vec::new();
    if let Err(e) = store.list(d, rel, &mut l, &mut errors) {
        notes.push(format!("{}: {}", String::from_utf8_lossy(rel), cause(&e)));
        return;
    }
    for e in errors {
        notes.push(format!(
            "{}: {}",
            String::from_utf8_lossy(&ferry_engine::entry::join(rel, &e.name)),
            e.err
        ));
    }
    for e in l.entries() {
        let name = l.name(e);
        if ferry_engine::keep::is_versions_dir(name) || !plain_name(name) {
            continue;
        }
        let sub = ferry_engine::entry::join(rel, name);
        match e.meta.kind {
            Kind::Dir => match store.open_dir(d, l.cname(e)) {
                Ok(sd) => live_files(store, &sd, &sub, out, notes),
                Err(err) => notes.push(format!(
                    "{}: {}",
                    String::from_utf8_lossy(&sub),
                    cause(&err)
                )),
            },
            _ => out.push((sub, e.meta)),
        }
    }
}

/// A name that stays in its directory: not empty, `.`, `..`, nor holding
/// a `/` (an object store's key may have any of these).
pub(super) fn plain_name(n: &[u8]) -> bool {
    !n.is_empty() && n != b"." && n != b".." && !n.contains(&b'/')
}

/// A path below a root whose every component is a plain name: PATH
/// never escapes its replica.
pub(super) fn plain_rel(rel: &[u8]) -> bool {
    rel.is_empty() || rel.split(|&c| c == b'/').all(plain_name)
}

/// Look PATH (`rel` below the root) up in its replica; `Ok(None)` when it
/// names nothing known (neither a live entry nor one with versions).
pub(super) fn target(
    store: &AnyStore,
    rel: &[u8],
    bk: Option<&Backups>,
    notes: &mut Vec<String>,
) -> io::Result<Option<Target>> {
    if !plain_rel(rel) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a path with an empty, `.` or `..` component (it could leave the replica)",
        ));
    }
    if rel
        .split(|&c| c == b'/')
        .any(ferry_engine::keep::is_versions_dir)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "inside .ferry-versions: name the file whose versions these are",
        ));
    }
    // `known`: PATH is a directory (the root, or a live directory); else
    // it is one only when something is below it (an object store has no
    // directories of its own).
    let dir_target = |known: bool, notes: &mut Vec<String>| -> io::Result<Option<Target>> {
        let mut files: BTreeMap<Vec<u8>, History> = BTreeMap::new();
        let mut v = Vec::new();
        if let Some(d) = open_versions_dir(store, &open_root(store)?, rel)? {
            collect(store, &d, rel, None, true, &mut v, notes);
        }
        if let Some(b) = bk {
            b.collect(rel, None, &mut v, notes)?;
        }
        for x in v {
            files
                .entry(x.rel())
                .or_insert_with(|| History {
                    rel: x.rel(),
                    live: None,
                    versions: Vec::new(),
                    broot: bk.map(|b| b.root.clone()),
                    sp: Default::default(),
                })
                .versions
                .push(x);
        }
        let mut live = Vec::new();
        if let Some(d) = live_dir(store, open_root(store)?, rel, false)? {
            live_files(store, &d, rel, &mut live, notes);
        }
        if !known && live.is_empty() && files.is_empty() {
            return Ok(None);
        }
        for (r, m) in live {
            files
                .entry(r.clone())
                .or_insert_with(|| History {
                    rel: r,
                    live: None,
                    versions: Vec::new(),
                    broot: bk.map(|b| b.root.clone()),
                    sp: Default::default(),
                })
                .live = Some(m);
        }
        for h in files.values_mut() {
            h.versions.sort_by_key(|v| (v.kept, v.n));
        }
        Ok(Some(Target::Dir {
            rel: rel.to_vec(),
            files,
        }))
    };
    if rel.is_empty() {
        return dir_target(true, notes);
    }
    let (pdir, name) = split_parent(rel);
    let live = match live_dir(store, open_root(store)?, pdir, false)? {
        Some(d) => store.stat(&d, &cstr(name)?)?,
        None => None,
    };
    if live.is_some_and(|m| m.kind == Kind::Dir) {
        return dir_target(true, notes);
    }
    let mut versions = Vec::new();
    if let Some(d) = open_versions_dir(store, &open_root(store)?, pdir)? {
        collect(store, &d, pdir, Some(name), false, &mut versions, notes);
    }
    if let Some(b) = bk {
        b.collect(pdir, Some(name), &mut versions, notes)?;
    }
    versions.sort_by_key(|v| (v.kept, v.n));
    if live.is_some() || !versions.is_empty() {
        return Ok(Some(Target::File(History {
            rel: rel.to_vec(),
            live,
            versions,
            broot: bk.map(|b| b.root.clone()),
            sp: Default::default(),
        })));
    }
    // A deleted directory with versions below it, or a directory an
    // object store knows only by the objects under it.
    dir_target(false, notes)
}
