//! Where PATH's versions are: its replica (the nearest `.ferry-versions`
//! above it), a backup directory, or DST's replica with `--from`.

use super::*;

/// A replica found above PATH: its root and PATH below it.
pub(super) struct Replica {
    pub(super) root: Root,
    pub(super) rel: Vec<u8>,
}

/// A backup directory (`--backup-dir DIR [--suffix SUF]`) whose tree
/// mirrors a replica's: what a run kept there is listed and restored
/// as versions.
pub(super) struct Backups {
    pub(super) store: AnyStore,
    pub(super) root: Root,
    pub(super) suffix: Vec<u8>,
    /// How a restore keeps what it replaces: into the same directory.
    pub(super) rule: KeepRule,
}

impl Backups {
    /// The backups of the file `only` (or of every file, walking
    /// subdirectories) in the directory `dir` (below the backup root,
    /// as below the replica's).
    pub(super) fn collect(
        &self,
        dir: &[u8],
        only: Option<&[u8]>,
        out: &mut Vec<Version>,
        notes: &mut Vec<String>,
    ) -> io::Result<()> {
        let Some(d) = live_dir(&self.store, open_root(&self.store)?, dir, false)? else {
            return Ok(());
        };
        self.walk(&d, dir, only, out, notes);
        Ok(())
    }

    pub(super) fn walk(
        &self,
        d: &AnyDir,
        dir: &[u8],
        only: Option<&[u8]>,
        out: &mut Vec<Version>,
        notes: &mut Vec<String>,
    ) {
        let mut l = Listing::new();
        let mut errors = Vec::new();
        if let Err(e) = self.store.list(d, dir, &mut l, &mut errors) {
            notes.push(format!("{}: {}", location(&self.root, dir), cause(&e)));
            return;
        }
        for e in l.entries() {
            let vname = l.name(e);
            if !plain_name(vname) {
                continue;
            }
            if e.meta.kind == Kind::Dir {
                if only.is_none() {
                    let sub = ferry_engine::entry::join(dir, vname);
                    match self.store.open_dir(d, l.cname(e)) {
                        Ok(sd) => self.walk(&sd, &sub, only, out, notes),
                        Err(err) => {
                            notes.push(format!("{}: {}", location(&self.root, &sub), cause(&err)))
                        }
                    }
                }
                continue;
            }
            let Some((name, n)) = ferry_engine::keep::parse_backup_name(vname, &self.suffix) else {
                continue;
            };
            if only.is_some_and(|o| o != name.as_slice()) {
                continue;
            }
            // When it was kept: its change time (the link or rename that
            // kept it), else its mtime.
            // (A store marks a ctime it has with the top bit.)
            let kept = match e.meta.ctime & !(1 << 63) {
                0 => e.meta.mtime_sec,
                c => (c / 1_000_000_000) as i64,
            };
            out.push(Version {
                dir: dir.to_vec(),
                name,
                vname: vname.to_vec(),
                kept,
                n,
                meta: e.meta,
                backup: true,
            });
        }
    }
}

/// The replica above PATH that keeps backups in `dir` (`--backup-dir`,
/// relative to the replica's root as a run takes it, or absolute), with
/// those backups: the ancestor of PATH, farthest first, whose backup
/// directory has PATH's directory, holding a backup of PATH (or PATH as
/// a directory). Local paths only.
pub(super) fn find_backups(
    reg: &Backends,
    path: &Path,
    dir: &Path,
    suffix: &[u8],
) -> Result<(Replica, Backups), String> {
    let loc = Location::parse(path.as_os_str());
    let Location::Local(p) = &loc else {
        return Err(format!("{loc}: with --backup-dir, PATH is a local path"));
    };
    let abs = absolute(p).map_err(|e| format!("{loc}: {}", cause(&e)))?;
    let ancestors: Vec<&Path> = abs.ancestors().collect();
    for a in ancestors.into_iter().rev() {
        let b = absolute(&a.join(dir)).map_err(|e| format!("--backup-dir: {}", cause(&e)))?;
        let rel = abs.strip_prefix(a).unwrap_or(Path::new(""));
        let relb = rel.as_os_str().as_bytes();
        let (pdir, name) = split_parent(relb);
        let bdir = b.join(std::ffi::OsStr::from_bytes(pdir));
        let Ok(rd) = std::fs::read_dir(&bdir) else {
            continue;
        };
        let found = relb.is_empty()
            || b.join(rel).is_dir()
            || rd.flatten().any(|e| {
                ferry_engine::keep::parse_backup_name(e.file_name().as_bytes(), suffix)
                    .is_some_and(|(n, _)| n == name)
            });
        if !found || b.starts_with(a) && b == a {
            continue;
        }
        let root = local_root(a);
        let broot = local_root(&b);
        let base = ferry_backends::keep::keep_base(&root, dir.as_os_str())?;
        return Ok((
            Replica {
                root,
                rel: relb.to_vec(),
            },
            Backups {
                store: open_store(reg, &broot)?,
                root: broot,
                suffix: suffix.to_vec(),
                rule: KeepRule::BackupDir {
                    base,
                    suffix: suffix.to_vec(),
                },
            },
        ));
    }
    Err(format!(
        "{loc}: no backup of it in {} (nor of a directory holding it)",
        dir.display()
    ))
}

/// Find the replica holding `path`: the nearest directory at or above it
/// with a `.ferry-versions` directory.
pub(super) fn find_replica(reg: &Backends, path: &Path) -> Result<Replica, String> {
    let (root, rel) = reg.find_replica(path)?;
    Ok(Replica { root, rel })
}

/// Open a replica's store.
pub(super) fn open_store(reg: &Backends, root: &Root) -> Result<AnyStore, String> {
    Ok(reg.open(
        root,
        &Opts {
            jobs: 4,
            lazy_meta: false,
            walk: false,
        },
    )?)
}

pub(super) fn print_notes(notes: Vec<String>) {
    for n in notes {
        eprintln!("ferry: note: {}", text_name_string(n.as_bytes()));
    }
}

/// Look `rep.rel` up in its replica; every failure is one line (exit 2).
pub(super) fn lookup_in(
    typed: &str,
    rep: &Replica,
    store: &AnyStore,
    bk: Option<&Backups>,
) -> Result<Target, String> {
    let mut notes = Vec::new();
    let t =
        target(store, &rep.rel, bk, &mut notes).map_err(|e| format!("{typed}: {}", cause(&e)))?;
    print_notes(notes);
    t.ok_or_else(|| {
        format!(
            "{typed}: no such file or directory, and no versions of it kept in {}",
            location(&rep.root, VERSIONS_DIR)
        )
    })
}

/// Find PATH's replica, open its store and look PATH up; every failure
/// is one line (exit 2).
pub(super) fn lookup(
    reg: &Backends,
    path: &Path,
    backup: Option<(&Path, &[u8])>,
) -> Result<(Replica, AnyStore, Target, Option<Backups>), String> {
    let typed = Location::parse(path.as_os_str()).to_string();
    let (rep, bk) = match backup {
        Some((dir, suffix)) => {
            let (r, b) = find_backups(reg, path, dir, suffix)?;
            (r, Some(b))
        }
        None => (find_replica(reg, path)?, None),
    };
    let store = open_store(reg, &rep.root)?;
    let t = lookup_in(&typed, &rep, &store, bk.as_ref())?;
    Ok((rep, store, t, bk))
}

/// `--from DST PATH`: PATH is in the tree synced to DST (SRC); its place
/// in DST is the trailing part of its path that DST has (live or with
/// versions) whose directory in DST shares the most names with PATH's
/// directory here (the longest such part on a tie); an existing directory
/// may be SRC's root, DST's root.
pub(super) fn lookup_from(
    reg: &Backends,
    dst: &Path,
    path: &Path,
) -> Result<(Replica, AnyStore, Target), String> {
    let loc = Location::parse(path.as_os_str());
    let Location::Local(p) = &loc else {
        return Err(format!(
            "{loc}: with --from, PATH is a local path in the tree synced to DST"
        ));
    };
    let abs = absolute(p).map_err(|e| format!("{loc}: {}", cause(&e)))?;
    let dst_rep = find_replica(reg, dst)?;
    let store = open_store(reg, &dst_rep.root)?;
    let is_dir = std::fs::metadata(&abs).is_ok_and(|m| m.is_dir());
    let comps: Vec<&[u8]> = abs
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.as_bytes()),
            _ => None,
        })
        .collect();
    // The names in PATH's directory here (PATH itself when a directory).
    let here_dir = if is_dir {
        abs.clone()
    } else {
        abs.parent().unwrap_or(Path::new("/")).to_path_buf()
    };
    let here: std::collections::HashSet<Vec<u8>> = std::fs::read_dir(&here_dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().as_bytes().to_vec())
                .filter(|n| !ferry_engine::keep::is_versions_dir(n))
                .collect()
        })
        .unwrap_or_default();
    let mut best: Option<(usize, usize, Vec<u8>)> = None;
    // Longest part first; DST's root (the empty part) for a directory.
    let last = if is_dir {
        comps.len()
    } else {
        comps.len().saturating_sub(1)
    };
    for k in 0..=last {
        let tail = comps[k..].join(&b'/');
        let rel = ferry_engine::entry::join(&dst_rep.rel, &tail);
        let reserved = rel
            .split(|&c| c == b'/')
            .any(ferry_engine::keep::is_versions_dir);
        if reserved || !plain_rel(&rel) || !known(&store, &rel).unwrap_or(false) {
            continue;
        }
        let dir = if is_dir {
            rel.clone()
        } else {
            split_parent(&rel).0.to_vec()
        };
        let score = names_there(&store, &dir)
            .map(|n| n.iter().filter(|x| here.contains(*x)).count())
            .unwrap_or(0);
        let len = comps.len() - k;
        if best.as_ref().is_none_or(|b| (score, len) > (b.0, b.1)) {
            best = Some((score, len, rel));
        }
    }
    let Some((_, _, rel)) = best else {
        return Err(format!(
            "{loc}: neither it nor any trailing part of its path is in {} (live or with versions)",
            location(&dst_rep.root, &dst_rep.rel)
        ));
    };
    let mut notes = Vec::new();
    let t = target(&store, &rel, None, &mut notes)
        .map_err(|e| format!("{loc}: {}", cause(&e)))?
        .ok_or_else(|| format!("{loc}: {} went missing", location(&dst_rep.root, &rel)))?;
    print_notes(notes);
    Ok((
        Replica {
            root: dst_rep.root,
            rel,
        },
        store,
        t,
    ))
}

/// True when the replica has `rel`: live, or with versions (one stat and
/// one listing).
pub(super) fn known(store: &AnyStore, rel: &[u8]) -> io::Result<bool> {
    if rel.is_empty() {
        return Ok(true);
    }
    let (pdir, name) = split_parent(rel);
    if let Some(d) = live_dir(store, open_root(store)?, pdir, false)? {
        if store.stat(&d, &cstr(name)?)?.is_some() {
            return Ok(true);
        }
    }
    let mut v = Vec::new();
    let mut notes = Vec::new();
    if let Some(d) = open_versions_dir(store, &open_root(store)?, pdir)? {
        collect(store, &d, pdir, Some(name), false, &mut v, &mut notes);
    }
    // A deleted directory: versions below it.
    Ok(!v.is_empty() || open_versions_dir(store, &open_root(store)?, rel)?.is_some())
}

/// The names in the replica's directory `dir`: live entries, and files
/// that have versions there.
pub(super) fn names_there(store: &AnyStore, dir: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    if let Some(d) = live_dir(store, open_root(store)?, dir, false)? {
        let mut l = Listing::new();
        let mut errors = Vec::new();
        store.list(&d, dir, &mut l, &mut errors)?;
        out.extend(
            l.entries()
                .iter()
                .map(|e| l.name(e).to_vec())
                .filter(|n| !ferry_engine::keep::is_versions_dir(n)),
        );
    }
    let mut v = Vec::new();
    let mut notes = Vec::new();
    if let Some(d) = open_versions_dir(store, &open_root(store)?, dir)? {
        collect(store, &d, dir, None, false, &mut v, &mut notes);
    }
    out.extend(v.into_iter().map(|x| x.name));
    out.sort();
    out.dedup();
    Ok(out)
}
