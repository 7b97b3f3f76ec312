//! `ferry restore`: a file, or a directory as it was at a time, put back
//! in place, elsewhere (`--to`) or on standard output.

use super::*;

/// Where a restore writes.
pub(super) enum Dest {
    /// Back at the file's own path in its replica.
    InPlace,
    /// Standard output (`--to -`, one file).
    Stdout,
    /// `--to PATH` (or PATH itself with `--from`): a local path, for one
    /// file its new path, for a directory the directory that receives
    /// the tree.
    Path(PathBuf),
}

/// What a restore does with what is at its target now.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Replace {
    /// The file's own place in the replica: kept as a version there (a
    /// hard link or the store's own copy).
    InPlace,
    /// The same file in the tree synced to the replica (`--from`): kept
    /// as a version in the replica, by a copy.
    Twin,
    /// Another path (`--to`): never replaced.
    Never,
}

/// One file to put back: its history and the state taken.
pub(super) struct Job1<'h> {
    pub(super) h: &'h History,
    pub(super) p: Pick,
}

/// Where a restore writes one file.
pub(super) struct Out<'s> {
    pub(super) store: &'s AnyStore,
    /// The target's root (shown in lines).
    pub(super) root: &'s Root,
    /// The target file's path below `root`.
    pub(super) rel: Vec<u8>,
}

/// A local `--to` target: its store and root, and for one file its
/// path below that root.
pub(super) struct OutBase {
    pub(super) store: AnyStore,
    pub(super) root: Root,
    pub(super) rel: Vec<u8>,
}

/// What a restore needs of the replica.
pub(super) struct Ctx<'a> {
    pub(super) rep: &'a Replica,
    pub(super) store: &'a AnyStore,
    /// The backup directory given (`--backup-dir`): versions from there,
    /// and what a restore replaces kept there.
    pub(super) bk: Option<&'a Backups>,
    pub(super) now: i64,
    pub(super) tz: &'a TimeZone,
}

impl Ctx<'_> {
    /// Open (with `create`, making what is missing) the directory of the
    /// source state of `j`: the version's directory, or the live one.
    pub(super) fn source(&self, j: &Job1) -> io::Result<(AnyDir, CString, Meta, Vec<u8>)> {
        let root = open_root(self.store)?;
        match j.p {
            Pick::Version(i) => {
                let v = &j.h.versions[i];
                let d = match (v.backup, self.bk) {
                    (true, Some(b)) => live_dir(&b.store, open_root(&b.store)?, &v.dir, false)?,
                    _ => open_versions_dir(self.store, &root, &v.dir)?,
                }
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
                Ok((d, cstr(&v.vname)?, v.meta, v.path()))
            }
            Pick::Live => {
                let (pdir, name) = split_parent(&j.h.rel);
                let d = live_dir(self.store, root, pdir, false)?
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
                let m = j.h.live.expect("a live pick");
                Ok((d, cstr(name)?, m, j.h.rel.clone()))
            }
        }
    }

    /// Keep what `name` of `dir` (in `out`) is now, `cur`, as a version of
    /// `rel` in the replica: a link in place when `out` is the replica, a
    /// copy into its versions directory otherwise. Returns where it went.
    pub(super) fn keep_current(
        &self,
        out: &Out,
        dir: &AnyDir,
        name: &CStr,
        rel: &[u8],
        cur: &Meta,
        how: Replace,
    ) -> io::Result<Vec<u8>> {
        if !self.store.can_keep(&KeepBase::Root(VERSIONS_DIR.to_vec())) {
            return Err(io::Error::other(
                "this store cannot keep the current file as a version",
            ));
        }
        let rule = self.bk.map_or(KeepRule::Versions, |b| b.rule.clone());
        let k = Keeper::new(rule, self.now);
        match how {
            Replace::InPlace => {
                return k.keep(self.store, dir, name, rel, &Planned::new(cur, 1), true)
            }
            Replace::Never => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists; --to never replaces a file",
                ))
            }
            Replace::Twin => {}
        }
        if !matches!(cur.kind, Kind::File | Kind::Symlink) {
            return Err(io::Error::other(format!(
                "{} there: not replaced",
                cur.kind.as_str()
            )));
        }
        // A copy into the replica's versions directory, under a temporary
        // name, then moved to its version's name (never over another).
        let (pdir, _) = split_parent(rel);
        let root = open_root(self.store)?;
        let mut vd = live_dir(self.store, root, VERSIONS_DIR, true)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        for part in pdir.split(|&c| c == b'/').filter(|p| !p.is_empty()) {
            let n = cstr(part)?;
            vd = match self.store.open_dir(&vd, &n) {
                Ok(x) => x,
                Err(e) if missing(&e) => self.store.make_dir(&vd, &n)?,
                Err(e) => return Err(e),
            };
        }
        let tmp = cstr(format!(".ferry-restore.{}.{}", std::process::id(), self.now).as_bytes())?;
        if cur.kind == Kind::Symlink {
            let target = out.store.read_link(dir, name)?;
            self.store.create_symlink(&vd, &tmp, &target, cur)?;
        } else {
            copier(out.store, self.store, |c| {
                c.copy_file(FileCopy {
                    sdir: dir,
                    sname: name,
                    ddir: &vd,
                    name: &tmp,
                    rel,
                    meta: cur,
                    old: None,
                })
                .map(|_| ())
            })?;
        }
        let kept = self
            .store
            .stat(&vd, &tmp)?
            .ok_or_else(|| io::Error::other("the copy of the current file went missing"))?;
        let r = k.keep(self.store, &vd, &tmp, rel, &Planned::new(&kept, 1), false);
        if r.is_err() {
            let _ = self.store.remove(&vd, &tmp, false);
        }
        r
    }
}

/// Run `f` with a copier from `src` to `dst` that keeps everything a
/// run keeps: mode, times, owner (as root), every extended attribute and
/// ACL both stores can keep; returns `f`'s answer and prints the note
/// about attributes that could not be kept.
pub(super) fn copier<R>(
    src: &AnyStore,
    dst: &AnyStore,
    f: impl FnOnce(&Copier<AnyStore, AnyStore>) -> io::Result<R>,
) -> io::Result<R> {
    let xr = ferry_engine::xattr::XattrRun::new(
        ferry_engine::xattr::XattrSel::ALL,
        src.xattr_caps(),
        dst.xattr_caps(),
    );
    let moved = AtomicU64::new(0);
    let c = Copier {
        src,
        dst,
        fsync: true,
        bwlimit: None,
        moved: &moved,
        xattrs: xr.active(),
        delta: None,
        keep: None,
        mtime_step: ferry_engine::store::mtime_step(src, dst),
        // A version the store kept of its own file: its mode as it was.
        special: None,
        grow: None,
    };
    f(&c)
}

/// Put back one file: the state `j` of its history into `out` (its
/// directory created as needed). What is there now is kept first as a
/// version in the replica. Returns the line to print.
pub(super) fn restore_one(
    cx: &Ctx,
    j: &Job1,
    out: &Out,
    how: Replace,
    dry_run: bool,
) -> Result<String, String> {
    let root = &cx.rep.root;
    let shown = location(out.root, &out.rel);
    let fail = |e: io::Error| format!("{shown}: not restored: {}", cause(&e));
    let meta = j.h.meta(j.p);
    let from = j.h.where_text(root, j.p);
    if meta.kind != Kind::File && meta.kind != Kind::Symlink {
        return Err(format!(
            "{from}: a {} cannot be restored",
            meta.kind.as_str()
        ));
    }
    let written = local_time(j.h.written(j.p), cx.tz);
    let what = match j.p {
        Pick::Live => format!("{from} (written {written}, current)"),
        Pick::Version(i) => format!(
            "{from} (written {written}, replaced {})",
            local_time(j.h.versions[i].kept, cx.tz)
        ),
    };
    let (pdir, name) = split_parent(&out.rel);
    let cname = cstr(name).map_err(fail)?;
    if dry_run {
        // What is there now, as far as it can be seen (a target that does
        // not exist yet has nothing).
        let current = open_root(out.store)
            .ok()
            .and_then(|r| live_dir(out.store, r, pdir, false).ok().flatten())
            .and_then(|d| out.store.stat(&d, &cname).ok().flatten());
        if current.is_some_and(|m| m.kind == Kind::Dir) {
            return Err(format!("{shown}: is a directory now; not replaced"));
        }
        if current.is_some() && how == Replace::Never {
            return Err(format!(
                "{shown}: not restored: exists; --to never replaces a file"
            ));
        }
        return Ok(format!(
            "would restore {shown} from {what}{}",
            if current.is_some() {
                "; the current file would be kept as a version"
            } else {
                ""
            }
        ));
    }
    let odir = live_dir(out.store, open_root(out.store).map_err(fail)?, pdir, true)
        .map_err(fail)?
        .ok_or_else(|| fail(io::Error::from(io::ErrorKind::NotFound)))?;
    let current = out.store.stat(&odir, &cname).map_err(fail)?;
    if current.is_some_and(|m| m.kind == Kind::Dir) {
        return Err(format!("{shown}: is a directory now; not replaced"));
    }
    let (sdir, sname, smeta, _) = cx.source(j).map_err(fail)?;
    // A file that holds that content already (same size, mtime and
    // bytes) is left as it is: a restore run twice keeps nothing twice.
    if let Some(cur) = &current {
        if cur.kind == Kind::File
            && smeta.kind == Kind::File
            && (cur.size, cur.mtime_sec, cur.mtime_nsec)
                == (smeta.size, smeta.mtime_sec, smeta.mtime_nsec)
            && same_bytes(cx.store, &sdir, &sname, out.store, &odir, &cname).unwrap_or(false)
        {
            return Ok(format!("{SAME}{shown} (it holds {what} already)"));
        }
    }
    // What the file is now goes into the history first: a restore loses
    // nothing.
    let mut kept_as = None;
    if let Some(cur) = &current {
        let p = cx
            .keep_current(out, &odir, &cname, &j.h.rel, cur, how)
            .map_err(fail)?;
        kept_as = Some(p);
    }
    copier(cx.store, out.store, |c| {
        if smeta.kind == Kind::Symlink {
            let target = cx.store.read_link(&sdir, &sname)?;
            out.store.create_symlink(&odir, &cname, &target, &smeta)?;
            c.new_entry_xattrs(&sdir, &sname, &odir, &cname, &smeta)
        } else {
            c.copy_file(FileCopy {
                sdir: &sdir,
                sname: &sname,
                ddir: &odir,
                name: &cname,
                rel: &out.rel,
                meta: &smeta,
                old: current.as_ref(),
            })
            .map(|_| ())
        }
    })
    .map_err(fail)?;
    let mut line = format!("restored {shown} from {what}");
    if let Some(p) = kept_as {
        // A backup directory outside the replica is shown whole.
        let at = match root {
            _ if root.local_path().is_some() && p.starts_with(b"/") => text_name_string(&p),
            _ => location(root, &p),
        };
        line.push_str(&format!("; the file it replaced is kept as {at}"));
    }
    Ok(line)
}

/// The start of [`restore_one`]'s line for a file left as it is.
pub(super) const SAME: &str = "unchanged ";

/// True when the two files hold the same bytes.
pub(super) fn same_bytes(
    a: &AnyStore,
    ad: &AnyDir,
    an: &CStr,
    b: &AnyStore,
    bd: &AnyDir,
    bn: &CStr,
) -> io::Result<bool> {
    use ferry_engine::store::SourceFile;
    let mut ra = a.open_file(ad, an)?;
    let mut rb = b.open_file(bd, bn)?;
    let (mut x, mut y) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = ra.read(&mut x)?;
        let mut m = 0;
        while m < n {
            let k = rb.read(&mut y[m..n])?;
            if k == 0 {
                return Ok(false);
            }
            m += k;
        }
        if x[..n] != y[..n] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Write the state `j` of a file to standard output.
pub(super) fn to_stdout(cx: &Ctx, j: &Job1) -> Result<(), String> {
    let meta = j.h.meta(j.p);
    let shown = location(&cx.rep.root, &j.h.rel);
    if meta.kind != Kind::File {
        return Err(format!(
            "{shown}: a {} at that time: --to - writes a file's content",
            meta.kind.as_str()
        ));
    }
    let fail = |e: io::Error| format!("{shown}: {}", cause(&e));
    let (d, n, _, _) = cx.source(j).map_err(fail)?;
    let mut r = cx.store.open_file(&d, &n).map_err(fail)?;
    let mut so = io::stdout().lock();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let k = ferry_engine::store::SourceFile::read(&mut r, &mut buf).map_err(fail)?;
        if k == 0 {
            break;
        }
        match so.write_all(&buf[..k]) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(format!("stdout: {}", cause(&e))),
            Ok(()) => {}
        }
    }
    so.flush().map_err(|e| format!("stdout: {}", cause(&e)))
}

/// The store and path of a local `--to` target: for a file, PATH (or
/// PATH/NAME when PATH is a directory); for a directory, PATH itself
/// (made when missing).
pub(super) fn local_out(
    reg: &Backends,
    p: &Path,
    file_name: Option<&[u8]>,
    create: bool,
) -> Result<OutBase, String> {
    let typed = p.display().to_string();
    let abs = absolute(p).map_err(|e| format!("--to {typed}: {}", cause(&e)))?;
    let is_dir = std::fs::metadata(&abs).is_ok_and(|m| m.is_dir());
    let (dir, rel) = match file_name {
        Some(n) if is_dir => (abs, n.to_vec()),
        Some(_) => {
            let name = abs
                .file_name()
                .ok_or_else(|| format!("--to {typed}: not a file name"))?
                .as_bytes()
                .to_vec();
            (abs.parent().unwrap_or(Path::new("/")).to_path_buf(), name)
        }
        None => {
            if !is_dir && create {
                std::fs::create_dir(&abs).map_err(|e| format!("--to {typed}: {}", cause(&e)))?;
            }
            (abs, Vec::new())
        }
    };
    if create && !std::fs::metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Err(format!(
            "--to {typed}: {}: no such directory",
            dir.display()
        ));
    }
    let root = local_root(&dir);
    Ok(OutBase {
        store: open_store(reg, &root)?,
        root,
        rel,
    })
}

/// `ferry restore PATH [--at TIME] [--to PATH|-] [--from DST] [-n]`.
pub fn run_restore(a: RestoreArgs, reg: &Backends) -> Result<u8, String> {
    let now = now_unix();
    let tz = TimeZone::system();
    let at = a.at.as_deref().map(|s| parse_at(s, now, &tz)).transpose()?;
    let suffix = a.suffix.as_deref().unwrap_or("").as_bytes().to_vec();
    let backup = a.backup_dir.as_deref().map(|d| (d, suffix.as_slice()));
    let dest = match (&a.to, &a.from) {
        (Some(p), _) if p.as_os_str() == "-" => Dest::Stdout,
        (Some(p), _) => Dest::Path(p.clone()),
        (None, Some(_)) => Dest::Path(a.path.clone()),
        (None, None) => Dest::InPlace,
    };
    // Checked before any replica is read: a restore writes local files only.
    if let Dest::Path(p) = &dest {
        let l = Location::parse(p.as_os_str());
        if !l.is_local() {
            return Err(format!(
                "{}: a restore writes to a local path only (ssh, SFTP and S3 destinations are not supported): restore to a local path, then `ferry copy` it to {l}",
                if a.to.is_some() { format!("--to {l}") } else { l.to_string() }
            ));
        }
    }
    let (rep, store, t, bk) = match &a.from {
        Some(_) if backup.is_some() => {
            return Err("--from and --backup-dir do not go together (yet)".into())
        }
        Some(dst) => {
            let (r, s, t) = lookup_from(reg, dst, &a.path)?;
            (r, s, t, None)
        }
        None => lookup(reg, &a.path, backup)?,
    };
    let how = match (&dest, &a.to) {
        (Dest::InPlace, _) => Replace::InPlace,
        (_, None) => Replace::Twin,
        _ => Replace::Never,
    };
    let cx = Ctx {
        rep: &rep,
        store: &store,
        bk: bk.as_ref(),
        now,
        tz: &tz,
    };
    let r = Restore {
        a: &a,
        reg,
        cx: &cx,
        dest: &dest,
        how,
        at,
    };
    match t {
        Target::File(h) => r.file(&h),
        Target::Dir { rel, files } => r.dir(&rel, &files),
    }
}

/// One `ferry restore`, its target found.
struct Restore<'a> {
    a: &'a RestoreArgs,
    reg: &'a Backends,
    cx: &'a Ctx<'a>,
    dest: &'a Dest,
    how: Replace,
    at: Option<i64>,
}

impl Restore<'_> {
    fn at_text(&self, t: i64) -> String {
        local_time(t, self.cx.tz)
    }

    /// Put back one file.
    fn file(&self, h: &History) -> Result<u8, String> {
        let (a, cx, at) = (self.a, self.cx, self.at);
        let shown = location(&cx.rep.root, &h.rel);
        let Some(p) = h.pick(at) else {
            return Err(match at {
                None => format!("{shown}: no versions kept"),
                Some(at) => {
                    let first = if h.versions.is_empty() {
                        Pick::Live
                    } else {
                        Pick::Version(0)
                    };
                    format!(
                        "{shown}: did not exist at {} as far as its versions tell (the oldest state written {})",
                        self.at_text(at),
                        self.at_text(h.written(first))
                    )
                }
            });
        };
        let j = Job1 { h, p };
        let base;
        let out = match self.dest {
            Dest::Stdout => {
                if a.dry_run {
                    println!("would write {shown} to standard output");
                    return Ok(0);
                }
                to_stdout(cx, &j)?;
                return Ok(0);
            }
            Dest::InPlace if p == Pick::Live => {
                println!(
                    "{shown}: already as it was at {} (the current file, written {})",
                    self.at_text(at.unwrap_or(cx.now)),
                    self.at_text(h.written(p))
                );
                return Ok(0);
            }
            Dest::InPlace => Out {
                store: cx.store,
                root: &cx.rep.root,
                rel: h.rel.clone(),
            },
            Dest::Path(p) => {
                let (_, name) = split_parent(&h.rel);
                base = local_out(self.reg, p, Some(name), !a.dry_run)?;
                Out {
                    store: &base.store,
                    root: &base.root,
                    rel: base.rel.clone(),
                }
            }
        };
        let line = restore_one(cx, &j, &out, self.how, a.dry_run)?;
        println!("{line}");
        Ok(0)
    }

    /// Put back a directory (`rel`) as it was at `--at`: each of `files`.
    fn dir(&self, rel: &[u8], files: &BTreeMap<Vec<u8>, History>) -> Result<u8, String> {
        let (a, cx) = (self.a, self.cx);
        let typed = Location::parse(a.path.as_os_str()).to_string();
        let Some(at) = self.at else {
            return Err(format!(
                "{typed}: is a directory: restoring a directory needs --at TIME (see `ferry versions {typed}`)"
            ));
        };
        let out_base = match self.dest {
            Dest::Stdout => return Err(format!("{typed}: is a directory: --to - writes one file")),
            Dest::InPlace => None,
            Dest::Path(p) => Some(local_out(self.reg, p, None, !a.dry_run)?),
        };
        let (mut done, mut same, mut absent, mut failed) = (0u64, 0u64, 0u64, 0u64);
        for h in files.values() {
            let Some(p) = h.pick(Some(at)) else {
                absent += 1;
                continue;
            };
            let j = Job1 { h, p };
            let below = h.rel[rel.len()..]
                .strip_prefix(b"/")
                .unwrap_or(&h.rel[rel.len()..]);
            let out = match &out_base {
                None if p == Pick::Live => {
                    same += 1;
                    continue;
                }
                None => Out {
                    store: cx.store,
                    root: &cx.rep.root,
                    rel: h.rel.clone(),
                },
                Some(o) => Out {
                    store: &o.store,
                    root: &o.root,
                    rel: below.to_vec(),
                },
            };
            match restore_one(cx, &j, &out, self.how, a.dry_run) {
                Ok(line) if line.starts_with(SAME) => same += 1,
                Ok(line) => {
                    println!("{line}");
                    done += 1;
                }
                Err(e) => {
                    eprintln!("ferry: {e}");
                    failed += 1;
                }
            }
        }
        let mut s = format!(
            "ferry: {} {done} file{} as of {}",
            if a.dry_run {
                "would restore"
            } else {
                "restored"
            },
            if done == 1 { "" } else { "s" },
            self.at_text(at)
        );
        if same > 0 {
            s.push_str(&format!(", {same} unchanged since"));
        }
        if absent > 0 {
            s.push_str(&format!(
                ", {absent} that did not exist then left as they are"
            ));
        }
        if failed > 0 {
            s.push_str(&format!(", {failed} failed"));
        }
        eprintln!("{s}");
        Ok(if failed > 0 { 1 } else { 0 })
    }
}
