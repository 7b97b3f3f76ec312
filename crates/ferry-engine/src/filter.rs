//! What a run takes in: rules on names (`--include`, `--exclude`,
//! `--exclude-from`, `--filter-from`) and on the size and mtime of files
//! (`--min-size`, `--max-size`, `--min-age`, `--max-age`), decided on
//! (directory, name, [`Meta`]) after a directory is listed, the same way for
//! every backend.
//!
//! Name rules are gitignore globs. They are compiled into two matchers, one
//! for directories and one for everything else, so thousands of rules do
//! not cost a linear scan per path. gitignore lets the *last* matching line
//! decide while `+`/`-` rules let the *first* decide: the rules are added
//! in reverse order of priority, except the exclude rules, which keep their
//! gitignore order among themselves. Paths are matched relative to the root
//! of the tree being synced. The order of evaluation is in docs/CLI.md.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::entry::{same_names, Kind, Listing, Meta};
use crate::store::{is_temp_name, ListError, Store};

/// The rules as given, before they are compiled by [`Filter::new`].
#[derive(Debug, Default, Clone)]
pub struct Rules {
    /// `--include` globs: when any is given, files no rule includes are left out.
    pub include: Vec<String>,
    /// `--exclude` globs (gitignore lines).
    pub exclude: Vec<String>,
    /// `--exclude-from` files (gitignore files).
    pub exclude_from: Vec<PathBuf>,
    /// `--filter-from` files: `+ GLOB` / `- GLOB` lines, first match wins.
    pub filter_from: Vec<PathBuf>,
    /// Files smaller than this are left out (`--min-size`).
    pub min_size: Option<u64>,
    /// Files larger than this are left out (`--max-size`).
    pub max_size: Option<u64>,
    /// Files modified before this (ns since the epoch) are left out (`--max-age`).
    pub mtime_from: Option<i128>,
    /// Files modified after this (ns since the epoch) are left out (`--min-age`).
    pub mtime_to: Option<i128>,
}

/// Compiled rules.
#[derive(Debug, Clone)]
pub struct Filter {
    /// Name rules for everything that is not a directory.
    files: Gitignore,
    /// Name rules for directories.
    dirs: Gitignore,
    min_size: u64,
    max_size: u64,
    mtime_from: Option<i128>,
    mtime_to: Option<i128>,
}

/// A rule that could not be read or parsed.
#[derive(Debug)]
pub struct FilterError(pub String);

impl std::fmt::Display for FilterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One name rule, in the order of priority.
struct Line {
    /// The gitignore line.
    text: String,
    /// Where it came from, for errors.
    from: String,
}

/// A `+`/`-` rule as gitignore lines: `(for non-directories, for directories)`.
/// A glob ending in `/` is a directory rule; `- GLOB/**` also leaves out the
/// directory GLOB itself (nothing in it could be taken).
fn plus_minus(include: bool, glob: &str) -> (Option<String>, Option<String>) {
    // gitignore reads a leading `!` or `#` as syntax: escape it.
    let esc = if glob.starts_with(['!', '#']) {
        format!("\\{glob}")
    } else {
        glob.to_string()
    };
    let line = |g: &str| {
        if include {
            format!("!{g}")
        } else {
            g.to_string()
        }
    };
    if esc.ends_with('/') {
        return (None, Some(line(&esc)));
    }
    let dir = match esc.strip_suffix("/**") {
        Some(d) if !include && !d.is_empty() => Some(line(&format!("{d}/"))),
        _ => None,
    };
    (Some(line(&esc)), dir)
}

impl Filter {
    /// Compile `rules`. Returns `None` when there are none (the fast path:
    /// no matching at all).
    pub fn new(rules: &Rules) -> Result<Option<Filter>, FilterError> {
        let names = !(rules.include.is_empty()
            && rules.exclude.is_empty()
            && rules.exclude_from.is_empty()
            && rules.filter_from.is_empty());
        let meta = rules.min_size.is_some()
            || rules.max_size.is_some()
            || rules.mtime_from.is_some()
            || rules.mtime_to.is_some();
        if !names && !meta {
            return Ok(None);
        }
        // Each list in the order of priority: --include, then the exclude
        // rules (a block in gitignore order), then --filter-from, then the
        // implicit exclusion of every file when --include is given.
        let mut l = (Vec::new(), Vec::new());
        let push = |l: &mut (Vec<Line>, Vec<Line>),
                    (f, d): (Option<String>, Option<String>),
                    from: &str| {
            let line = |text| Line {
                text,
                from: from.to_string(),
            };
            l.0.extend(f.map(line));
            l.1.extend(d.map(line));
        };
        for g in &rules.include {
            push(&mut l, plus_minus(true, g), &format!("--include {g:?}"));
        }
        let excl_start = (l.0.len(), l.1.len());
        for f in &rules.exclude_from {
            let text = read(f)?;
            for line in text.lines() {
                let both = (Some(line.to_string()), Some(line.to_string()));
                push(&mut l, both, &f.display().to_string());
            }
        }
        for g in &rules.exclude {
            push(
                &mut l,
                (Some(g.clone()), Some(g.clone())),
                &format!("--exclude {g:?}"),
            );
        }
        let excl_end = (l.0.len(), l.1.len());
        for f in &rules.filter_from {
            let text = read(f)?;
            for (n, line) in text.lines().enumerate() {
                let t = line.trim();
                if t.is_empty() || t.starts_with(['#', ';']) {
                    continue;
                }
                let from = format!("--filter-from {}:{}", f.display(), n + 1);
                match (t.strip_prefix("+ "), t.strip_prefix("- ")) {
                    (Some(g), _) => push(&mut l, plus_minus(true, g.trim_start()), &from),
                    (_, Some(g)) => push(&mut l, plus_minus(false, g.trim_start()), &from),
                    _ => {
                        return Err(FilterError(format!(
                            "{from}: {t:?}: expected \"+ GLOB\" or \"- GLOB\""
                        )))
                    }
                }
            }
        }
        if !rules.include.is_empty() {
            push(&mut l, (Some("*".into()), None), "--include");
        }
        Ok(Some(Filter {
            files: compile(&l.0, excl_start.0..excl_end.0)?,
            dirs: compile(&l.1, excl_start.1..excl_end.1)?,
            min_size: rules.min_size.unwrap_or(0),
            max_size: rules.max_size.unwrap_or(u64::MAX),
            mtime_from: rules.mtime_from,
            mtime_to: rules.mtime_to,
        }))
    }

    /// True when the rules look at mtimes, which must then be exact.
    pub fn needs_mtime(&self) -> bool {
        self.mtime_from.is_some() || self.mtime_to.is_some()
    }

    /// True when `dir/name` (relative to the root) is left out by the name
    /// rules alone.
    pub fn excluded(&self, dir: &[u8], name: &[u8], is_dir: bool) -> bool {
        let mut p = Vec::with_capacity(dir.len() + name.len() + 2);
        p.push(b'/');
        p.extend_from_slice(dir);
        if !dir.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        self.path_out(&p, is_dir)
    }

    /// `path` is `/`, the relative path, as matched.
    fn path_out(&self, path: &[u8], is_dir: bool) -> bool {
        let m = if is_dir { &self.dirs } else { &self.files };
        m.matched(Path::new(OsStr::from_bytes(path)), is_dir)
            .is_ignore()
    }

    /// True when an entry with this metadata at `path` is left out.
    fn out(&self, path: &[u8], m: &Meta) -> bool {
        if m.kind == Kind::File {
            let t = m.mtime_ns();
            if m.size < self.min_size
                || m.size > self.max_size
                || self.mtime_from.is_some_and(|f| t < f)
                || self.mtime_to.is_some_and(|to| t > to)
            {
                return true;
            }
        }
        self.path_out(path, m.kind == Kind::Dir)
    }

    /// Which entries of `list` (the directory `rel`) are left out, each
    /// decided on its own metadata.
    fn verdicts(&self, rel: &[u8], list: &Listing) -> Vec<bool> {
        let mut p = Vec::with_capacity(rel.len() + 64);
        p.push(b'/');
        p.extend_from_slice(rel);
        if !rel.is_empty() {
            p.push(b'/');
        }
        let base = p.len();
        list.entries()
            .iter()
            .map(|e| {
                // ferry's own temporaries are removed whatever the rules.
                if is_temp_name(list.name(e)) {
                    return false;
                }
                p.truncate(base);
                p.extend_from_slice(list.name(e));
                self.out(&p, &e.meta)
            })
            .collect()
    }

    /// Leave out of `list` (the directory `rel`) the entries the rules do,
    /// each decided on its own metadata, telling `left_out` each one's name
    /// and whether it was its size or mtime that did it.
    pub fn retain(&self, rel: &[u8], list: &mut Listing, mut left_out: impl FnMut(&[u8], bool)) {
        let out = self.verdicts(rel, list);
        for (e, _) in list.entries().iter().zip(&out).filter(|(_, o)| **o) {
            let name = list.name(e);
            left_out(name, !self.excluded(rel, name, e.meta.kind == Kind::Dir));
        }
        let mut i = 0;
        list.retain(|_| {
            i += 1;
            !out[i - 1]
        });
    }

    /// Leave out of a source and a destination listing of one directory
    /// what the rules do. A name the source has is decided on the source's
    /// entry, and the destination's entry of that name goes the same way (a
    /// file whose new version is taken replaces its old one, a file left
    /// out is neither copied nor deleted); a destination-only name is
    /// decided on its own metadata, so what is left out is never deleted.
    pub fn retain_pair(&self, rel: &[u8], src: &mut Listing, dst: &mut Listing) {
        let so = self.verdicts(rel, src);
        let mut dout = self.verdicts(rel, dst);
        same_names(src, dst, |i, j| dout[j] = so[i]);
        for (l, out) in [(src, &so), (dst, &dout)] {
            let mut k = 0;
            l.retain(|_| {
                k += 1;
                !out[k - 1]
            });
        }
    }

    /// Make ready a listing of `dir` (the directory `rel`) for [`Filter::retain`]
    /// or [`Filter::retain_pair`]: the exact mtimes of its files when the
    /// rules need them and the store lists approximate ones (a request per
    /// file on S3), and no error for an entry the name rules leave out
    /// whatever its kind. Returns the names (sorted) of the files whose
    /// mtime could not be made exact: left out of `list`, each in `errors`.
    pub fn prepare<S: Store>(
        &self,
        store: &S,
        dir: &S::Dir,
        rel: &[u8],
        list: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<Vec<Vec<u8>>> {
        errors
            .retain(|e| !(self.excluded(rel, &e.name, false) && self.excluded(rel, &e.name, true)));
        if !(self.needs_mtime() && store.features().approximate_meta) {
            return Ok(Vec::new());
        }
        let files: Vec<usize> = (0..list.len())
            .filter(|&i| list.entries()[i].meta.kind == Kind::File)
            .collect();
        let before = errors.len();
        if !files.is_empty() {
            store.refine(dir, list, &files, errors)?;
        }
        let mut bad: Vec<Vec<u8>> = errors[before..].iter().map(|e| e.name.clone()).collect();
        bad.sort();
        drop_names(list, &bad);
        Ok(bad)
    }
}

impl Filter {
    /// After `store` listed `dir` (the directory `rel`) into `list`: leave
    /// out what the rules do, each entry decided on its own metadata
    /// ([`Filter::prepare`], then [`Filter::retain`]). What one listing
    /// site calls, for every backend.
    pub fn apply<S: Store>(
        &self,
        store: &S,
        dir: &S::Dir,
        rel: &[u8],
        list: &mut Listing,
        errors: &mut Vec<ListError>,
        left_out: impl FnMut(&[u8], bool),
    ) -> io::Result<()> {
        self.prepare(store, dir, rel, list, errors)?;
        self.retain(rel, list, left_out);
        Ok(())
    }
}

/// Leave out of `list` the names in `sorted`.
pub fn drop_names(list: &mut Listing, sorted: &[Vec<u8>]) {
    if !sorted.is_empty() {
        list.retain_names(|n| sorted.binary_search_by(|b| b.as_slice().cmp(n)).is_err());
    }
}

fn read(f: &Path) -> Result<String, FilterError> {
    std::fs::read_to_string(f).map_err(|e| FilterError(format!("{}: {}", f.display(), e)))
}

/// One matcher from `lines` in the order of priority; `block` keeps its
/// own (gitignore) order.
fn compile(lines: &[Line], block: std::ops::Range<usize>) -> Result<Gitignore, FilterError> {
    // Root "/" so that anchored patterns (`/build`) anchor at the tree root
    // and relative paths joined onto it match.
    let mut b = GitignoreBuilder::new("/");
    let mut add = |l: &Line| {
        b.add_line(None, &l.text)
            .map(|_| ())
            .map_err(|e| FilterError(format!("{}: {e}", l.from)))
    };
    for l in lines[block.end..].iter().rev() {
        add(l)?;
    }
    for l in &lines[block.clone()] {
        add(l)?;
    }
    for l in lines[..block.start].iter().rev() {
        add(l)?;
    }
    b.build().map_err(|e| FilterError(e.to_string()))
}

/// A size: bytes, or a number (fractions allowed) with a binary suffix
/// `K`, `M`, `G`, `T`, `P` (powers of 1024, either case), optionally
/// followed by `i`, `B` or `iB` (`10M`, `1.5G`, `512KiB`, `100`).
/// Returns `String`: clap's `value_parser` contract (ferry's `--min-size`/`--max-size`
/// parser returns it as its usage error).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?}: not a size (e.g. 100, 512K, 10M, 1.5G)");
    let t = s.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let t = t.strip_suffix('i').unwrap_or(t);
    let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        Some('P') => (&t[..t.len() - 1], 50),
        _ => (t, 0),
    };
    if num.is_empty() || !num.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
        return Err(bad());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(1u64 << shift).ok_or_else(bad);
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = v * (1u64 << shift) as f64;
    if bytes.is_finite() && bytes < u64::MAX as f64 {
        Ok(bytes as u64)
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn f(globs: &[&str]) -> Filter {
        Filter::new(&Rules {
            exclude: strs(globs),
            ..Rules::default()
        })
        .unwrap()
        .unwrap()
    }

    fn file(size: u64, mtime_sec: i64) -> Meta {
        Meta {
            kind: Kind::File,
            size,
            mtime_sec,
            mtime_nsec: 0,
            mode: 0o644,
            uid: 0,
            gid: 0,
            ino: 0,
            version: 0,
            rdev: 0,
            sparse: false,
            nlink: 0,
            dev: 0,
            ctime: 0,
        }
    }

    fn dir() -> Meta {
        Meta {
            kind: Kind::Dir,
            ..file(4096, 0)
        }
    }

    fn names(l: &Listing) -> Vec<String> {
        l.entries()
            .iter()
            .map(|e| String::from_utf8_lossy(l.name(e)).into_owned())
            .collect()
    }

    #[test]
    fn gitignore_semantics() {
        let m = f(&["*.log", "build/", "/top", "!keep.log"]);
        assert!(m.excluded(b"", b"a.log", false));
        assert!(m.excluded(b"x/y", b"a.log", false));
        assert!(!m.excluded(b"", b"keep.log", false));
        assert!(m.excluded(b"src", b"build", true));
        assert!(!m.excluded(b"src", b"build", false));
        assert!(m.excluded(b"", b"top", false));
        assert!(!m.excluded(b"sub", b"top", false));
        assert!(!m.excluded(b"", b"a.txt", false));
    }

    #[test]
    fn no_rules_is_none() {
        assert!(Filter::new(&Rules::default()).unwrap().is_none());
    }

    #[test]
    fn include_leaves_out_other_files_not_directories() {
        let m = Filter::new(&Rules {
            include: strs(&["*.jpg", "/docs/**"]),
            ..Rules::default()
        })
        .unwrap()
        .unwrap();
        assert!(!m.excluded(b"a/b", b"x.jpg", false));
        assert!(m.excluded(b"a/b", b"x.png", false));
        assert!(!m.excluded(b"docs/sub", b"x.png", false));
        assert!(!m.excluded(b"a", b"b", true));
    }

    #[test]
    fn order_include_then_exclude_then_filter_from() {
        let mut ff = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            ff,
            "# comment\n; another\n\n- *.tmp\n+ keep.bak\n- *.bak\n- cache/**\n- !odd"
        )
        .unwrap();
        let m = Filter::new(&Rules {
            include: strs(&["*.tmp", "*.bak", "!odd"]),
            exclude: strs(&["secret.*"]),
            filter_from: vec![ff.path().to_path_buf()],
            ..Rules::default()
        })
        .unwrap()
        .unwrap();
        // --include comes first: `*.tmp` is taken though the file says `- *.tmp`.
        assert!(!m.excluded(b"", b"a.tmp", false));
        assert!(!m.excluded(b"", b"a.bak", false));
        // --exclude before --filter-from; the implicit exclusion last.
        assert!(m.excluded(b"", b"secret.txt", false));
        assert!(m.excluded(b"", b"other", false));
        // A `- DIR/**` line leaves out the directory too; `!` is a name.
        assert!(m.excluded(b"x", b"cache", true));
        assert!(!m.excluded(b"", b"!odd", false));
        assert!(!m.excluded(b"x", b"other", true));
    }

    #[test]
    fn filter_from_first_match_wins() {
        let mut ff = tempfile::NamedTempFile::new().unwrap();
        writeln!(ff, "+ keep.bak\n- *.bak\n+ *\n- never").unwrap();
        let m = Filter::new(&Rules {
            filter_from: vec![ff.path().to_path_buf()],
            ..Rules::default()
        })
        .unwrap()
        .unwrap();
        assert!(!m.excluded(b"", b"keep.bak", false));
        assert!(m.excluded(b"d", b"x.bak", false));
        assert!(!m.excluded(b"", b"never", false));
    }

    #[test]
    fn malformed_filter_line_names_the_file_and_line() {
        let mut ff = tempfile::NamedTempFile::new().unwrap();
        writeln!(ff, "+ a\n*.bak").unwrap();
        let e = Filter::new(&Rules {
            filter_from: vec![ff.path().to_path_buf()],
            ..Rules::default()
        })
        .unwrap_err();
        assert!(e.0.contains(":2: \"*.bak\""), "{e}");
    }

    #[test]
    fn size_and_age_apply_to_files_only() {
        let m = Filter::new(&Rules {
            min_size: Some(10),
            max_size: Some(100),
            mtime_from: Some(1_000 * 1_000_000_000),
            mtime_to: Some(2_000 * 1_000_000_000),
            ..Rules::default()
        })
        .unwrap()
        .unwrap();
        let mut l = Listing::new();
        for (n, meta) in [
            ("dir", dir()),
            ("ok", file(10, 1_000)),
            ("ok2", file(100, 2_000)),
            ("small", file(9, 1_500)),
            ("big", file(101, 1_500)),
            ("old", file(50, 999)),
            ("young", file(50, 2_001)),
        ] {
            l.push(n.as_bytes(), meta);
        }
        l.sort();
        let mut out = Vec::new();
        m.retain(b"", &mut l, |n, by_meta| out.push((n.to_vec(), by_meta)));
        assert_eq!(names(&l), ["dir", "ok", "ok2"]);
        assert_eq!(out.len(), 4);
        assert!(out.iter().all(|(_, by_meta)| *by_meta));
    }

    #[test]
    fn pair_follows_the_source() {
        let m = Filter::new(&Rules {
            max_size: Some(10),
            ..Rules::default()
        })
        .unwrap()
        .unwrap();
        let (mut s, mut d) = (Listing::new(), Listing::new());
        s.push(b"grown", file(50, 0));
        s.push(b"shrunk", file(5, 0));
        d.push(b"big-dst-only", file(50, 0));
        d.push(b"grown", file(5, 0));
        d.push(b"shrunk", file(50, 0));
        d.push(b"small-dst-only", file(5, 0));
        s.sort();
        d.sort();
        m.retain_pair(b"", &mut s, &mut d);
        assert_eq!(names(&s), ["shrunk"]);
        assert_eq!(names(&d), ["shrunk", "small-dst-only"]);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100").unwrap(), 100);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("10k").unwrap(), 10 << 10);
        assert_eq!(parse_size("10M").unwrap(), 10 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        assert_eq!(parse_size("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("7B").unwrap(), 7);
        for bad in ["10Q", "", "M", "-1", "1e3", "abc", "99999999999P"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
