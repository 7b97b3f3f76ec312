//! Keeping what a run replaces or removes in a destination: `--backup-dir`,
//! `--suffix` and `--versions`.
//!
//! Before the engine (or bisync) replaces or removes a file, a symlink or
//! a special file in a destination, it asks the [`Keeper`] to keep it; the
//! store moves the entry ([`crate::store::KeepStore::keep`]): a hard link or a rename
//! (local, ssh, sftp), a server-side copy (S3), never a download. A
//! directory is never kept whole: its entries are kept one by one, then
//! the emptied directory is removed. When keeping fails, the entry is
//! neither replaced nor removed (the run reports it and goes on): nothing
//! is lost.
//!
//! Where kept entries go ([`KeepRule`]):
//! - `--backup-dir DIR [--suffix SUF]`: `DIR/<path>[SUF]`, the entry's path
//!   below the destination root kept (rsync's and rclone's layout). A
//!   relative `DIR` is relative to the destination root (rsync); a full
//!   location must be on the same backend as the destination.
//! - `--suffix SUF` alone: beside the entry, `<path>SUF`; sync never
//!   deletes names ending in `SUF` (rsync's protect rule) unless the
//!   source has them too: a source's `foo~` is synced like any file.
//! - `--versions`: `.ferry-versions/<dir>/<stem>~YYYYMMDD-HHMMSS.<ext>` in
//!   the replica's root ([`VERSIONS_DIR`], never synced), the time that of
//!   the run in UTC; a second version of the same file in the same second
//!   gets `-2`, `-3`, ... after the time.
//!
//! A keep never replaces an entry (rsync's and rclone's do): when the name
//! is taken, by an older keep, a user's file, or a name the source has
//! (`--suffix` alone: the run is about to create it), the entry goes to
//! the first free one of `<path>SUF1SUF`, `<path>SUF2SUF`, ... (`foo~1~`,
//! `foo~2~`; `SUF` is `~` there when `--backup-dir` has no suffix), so the
//! highest number is the newest keep and every name still ends in `SUF`.
//! (Versions have their own numbers, `-2`, `-3`, ...)

use std::ffi::CStr;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::{Planned, Store, StoreExt};

/// The reserved directory, in a replica's root, that holds kept versions
/// (`--versions`). ferry never syncs an entry of this name, on any side.
pub const VERSIONS_DIR: &[u8] = b".ferry-versions";

/// True for the name of the versions directory.
pub fn is_versions_dir(name: &[u8]) -> bool {
    name == VERSIONS_DIR
}

/// Which versions are kept (`--keep N|staggered`, `--keep-days D`);
/// the default keeps them all. Pruned as part of each run with
/// `--versions`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// `--keep N`: the N newest versions of each file.
    pub last: Option<u32>,
    /// `--keep staggered` (Syncthing's): every version kept less than an
    /// hour ago, then one per hour for a day, one per day for a month,
    /// one per week after.
    pub staggered: bool,
    /// `--keep-days D`: none kept more than D days ago.
    pub days: Option<u32>,
}

/// What `--keep` says: a count or `staggered`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepArg {
    /// The N newest versions of each file.
    Last(u32),
    /// Syncthing's staggered thinning.
    Staggered,
}

impl KeepArg {
    /// Parse `N` (at least 1) or `staggered`.
    /// Returns `String`: clap's `value_parser` contract (the message is its usage error).
    pub fn parse(s: &str) -> Result<KeepArg, String> {
        if s.eq_ignore_ascii_case("staggered") {
            return Ok(KeepArg::Staggered);
        }
        match s.parse::<u32>() {
            Ok(n) if n > 0 => Ok(KeepArg::Last(n)),
            _ => Err(format!(
                "invalid --keep {s:?} (a count of versions like 10, or staggered)"
            )),
        }
    }
}

/// Where kept entries go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeepRule {
    /// `--backup-dir`: below `base`, at the entry's path plus `suffix`
    /// (empty: none), or a numbered name when that is taken.
    BackupDir {
        /// The backup directory.
        base: KeepBase,
        /// Added to each kept name (`--suffix`).
        suffix: Vec<u8>,
    },
    /// `--suffix` alone: beside the entry, its name plus the suffix, or a
    /// numbered name when that is taken.
    Suffix(Vec<u8>),
    /// `--versions`: in [`VERSIONS_DIR`] of the destination root, named by
    /// [`version_name`]. Never replaces an older version.
    Versions,
}

/// A directory kept entries go below, in the destination store's own
/// namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeepBase {
    /// A path below the destination store's root (`/`-separated, no
    /// leading `/`; empty: the root itself).
    Root(Vec<u8>),
    /// A path of the same store's namespace outside its root, as the store
    /// understands it: an absolute path (local, ssh, sftp) or
    /// `bucket/prefix` (S3, same endpoint and credentials).
    Abs(Vec<u8>),
}

/// One entry to keep, as a store sees it: `path` below `base`
/// (`/`-separated; parents are created as needed, with default modes).
#[derive(Clone, Copy, Debug)]
pub struct KeepTo<'a> {
    /// The directory `path` is below.
    pub base: &'a KeepBase,
    /// Where the entry goes below `base`.
    pub path: &'a [u8],
    /// Replace an entry already at `path`; when false the store fails
    /// with `AlreadyExists` instead, atomically (a link, a rename without
    /// replace). [`Keeper::keep`] never replaces: it tries the next name.
    pub overwrite: bool,
    /// The run is about to replace the entry with a new one, rather than
    /// remove it: the store may leave the entry in place if its kept copy
    /// is independent of it (a hard link, a server-side copy), so the name
    /// never goes missing; the caller's commit replaces it.
    pub replacing: bool,
    /// What the plan saw at the entry: a store that can check it cheaply
    /// keeps it (moves it away, or links it when `replacing`) only while
    /// it is still that ([`crate::store::Planned`]), else fails with
    /// [`crate::store::changed`].
    pub planned: Option<crate::store::Planned>,
}

/// What the run kept, for its summary.
#[derive(Debug, Default)]
pub struct KeptStats {
    /// Entries kept.
    pub files: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
}

/// Keeps the entries a run replaces or removes in its destination.
#[derive(Debug)]
pub struct Keeper {
    /// Where they go.
    pub rule: KeepRule,
    /// The run's time (Unix seconds, UTC) and its stamp, which name
    /// versions; injected so that tests can set the clock, and set anew
    /// for each run of a watch ([`Keeper::restamp`]).
    stamp: parking_lot::RwLock<(i64, String)>,
    /// What was kept.
    pub stats: KeptStats,
    /// Paths below the destination root that the source has and whose
    /// names `--suffix` alone protects ([`Keeper::reserve`]): the run may
    /// create them, so no keep takes them.
    reserved: parking_lot::Mutex<std::collections::HashSet<Vec<u8>>>,
    /// True once anything is reserved (the common run never locks).
    any_reserved: std::sync::atomic::AtomicBool,
}

impl Keeper {
    /// A keeper for a run at `now` (Unix seconds).
    pub fn new(rule: KeepRule, now: i64) -> Keeper {
        Keeper {
            rule,
            stamp: parking_lot::RwLock::new((now, stamp(now))),
            stats: KeptStats::default(),
            reserved: Default::default(),
            any_reserved: Default::default(),
        }
    }

    /// Tell the keeper that the source has the entry at `rel` (its path
    /// below the root): with `--suffix` alone, a name it protects is then
    /// never taken by a keep, for the run may be about to create it there
    /// (the source's `foo~` is synced, not replaced by a keep of `foo`).
    pub fn reserve(&self, rel: &[u8]) {
        if let KeepRule::Suffix(_) = self.rule {
            let (_, name) = split_parent(rel);
            if self.protects(name) {
                self.reserved.lock().insert(rel.to_vec());
                self.any_reserved.store(true, Ordering::Release);
            }
        }
    }

    fn is_reserved(&self, base: &KeepBase, path: &[u8]) -> bool {
        matches!(base, KeepBase::Root(b) if b.is_empty())
            && self.any_reserved.load(Ordering::Acquire)
            && self.reserved.lock().contains(path)
    }

    /// The run's time (Unix seconds).
    pub fn now(&self) -> i64 {
        self.stamp.read().0
    }

    /// Name the versions of the next run by `now` (a watch's runs share
    /// one keeper).
    pub fn restamp(&self, now: i64) {
        *self.stamp.write() = (now, stamp(now));
    }

    /// The base directory and path (below it) where the entry at `rel`
    /// (its path below the destination root) is kept; `n` > 1 is the
    /// n-th try of a name (the first ones were taken).
    pub fn target(&self, rel: &[u8], n: u32) -> (KeepBase, Vec<u8>) {
        match &self.rule {
            KeepRule::BackupDir { base, suffix } => (base.clone(), numbered(rel, suffix, n)),
            KeepRule::Suffix(suffix) => (KeepBase::Root(Vec::new()), numbered(rel, suffix, n)),
            KeepRule::Versions => {
                let (dir, name) = split_parent(rel);
                let mut p = dir.to_vec();
                if !p.is_empty() {
                    p.push(b'/');
                }
                let st = self.stamp.read();
                p.extend_from_slice(&version_name(name, &st.1, n));
                (KeepBase::Root(VERSIONS_DIR.to_vec()), p)
            }
        }
    }

    /// Keep the entry `name` of `dir` (at `rel` below the destination
    /// root, as planned `at`: a file, symlink or special file, never a
    /// directory) before the run replaces it (`replacing`) or removes it.
    /// Returns where it went, for the record: the path below the
    /// destination root, or the backup directory's path then `/` and the
    /// path below it. On error nothing was kept and the caller must leave
    /// the entry alone. An entry removed (not `replacing`) is moved only
    /// while it still is the one planned: else [`crate::store::changed`].
    pub fn keep<D: Store>(
        &self,
        store: &D,
        dir: &D::Dir,
        name: &CStr,
        rel: &[u8],
        at: &Planned,
        replacing: bool,
    ) -> io::Result<Vec<u8>> {
        // Never over an existing entry: the store fails with
        // `AlreadyExists` (atomically: link, rename without replace), and
        // the next name is tried.
        let mut n = 1;
        loop {
            let (base, path) = self.target(rel, n);
            if self.is_reserved(&base, &path) && n < MAX_TRIES {
                n += 1;
                continue;
            }
            let to = KeepTo {
                base: &base,
                path: &path,
                overwrite: false,
                replacing,
                planned: Some(*at),
            };
            match store.keep_entry(dir, name, &to) {
                Ok(()) => {
                    self.stats.files.fetch_add(1, Ordering::Relaxed);
                    self.stats.bytes.fetch_add(at.meta.size, Ordering::Relaxed);
                    return Ok(shown(&base, &path));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < MAX_TRIES => n += 1,
                Err(e) if crate::store::is_changed(&e) => return Err(e),
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "not replaced or removed: keeping it at {} failed: {e}",
                            String::from_utf8_lossy(&shown(&base, &path))
                        ),
                    ))
                }
            }
        }
    }

    /// Where the entry at `rel` would be kept, as [`Keeper::keep`] shows
    /// it (a dry run's answer: a version's first name of the second).
    pub fn place(&self, rel: &[u8]) -> Vec<u8> {
        let (base, path) = self.target(rel, 1);
        shown(&base, &path)
    }

    /// Where the entry `name` of `dir` (at `rel`) would be kept, for a dry
    /// run: with `--suffix` alone the names beside it that are taken (one
    /// `stat` each) or that the source has are passed over, as
    /// [`Keeper::keep`] would; elsewhere the first name tried.
    pub fn place_in<D: Store>(&self, store: &D, dir: &D::Dir, rel: &[u8]) -> Vec<u8> {
        let KeepRule::Suffix(_) = self.rule else {
            return self.place(rel);
        };
        let mut n = 1;
        loop {
            let (base, path) = self.target(rel, n);
            let (_, last) = split_parent(&path);
            let taken = n < MAX_TRIES
                && (self.is_reserved(&base, &path)
                    || std::ffi::CString::new(last)
                        .ok()
                        .is_some_and(|c| matches!(store.stat(dir, &c), Ok(Some(_)))));
            if !taken {
                return shown(&base, &path);
            }
            n += 1;
        }
    }

    /// True for a destination name that sync must never delete: with
    /// `--suffix` alone, the backups beside their files (rsync's protect
    /// rule for its backup suffix).
    pub fn protects(&self, name: &[u8]) -> bool {
        match &self.rule {
            KeepRule::Suffix(s) => !s.is_empty() && name.ends_with(s) && name.len() > s.len(),
            _ => false,
        }
    }

    /// The backup directory's path below the destination root when it is
    /// inside the destination: never synced (neither copied into nor
    /// deleted from).
    pub fn inside_root(&self) -> Option<&[u8]> {
        match &self.rule {
            KeepRule::BackupDir {
                base: KeepBase::Root(p),
                ..
            } if !p.is_empty() => Some(p),
            _ => None,
        }
    }
}

/// How many names a keep tries before it gives up (the entry is then
/// neither replaced nor removed).
const MAX_TRIES: u32 = 10_000;

/// The `n`-th name tried for a keep of `rel` with suffix `suffix`:
/// `rel SUF`, then `rel SUF (n-1) SUF` (`foo~`, `foo~1~`, `foo~2~`), with
/// `~` for an empty suffix in the numbered ones (`--backup-dir` alone:
/// `foo`, `foo~1~`).
fn numbered(rel: &[u8], suffix: &[u8], n: u32) -> Vec<u8> {
    let mut p = rel.to_vec();
    // The suffix, or `~` when there is none and a number follows.
    let mark: &[u8] = if suffix.is_empty() && n > 1 {
        b"~"
    } else {
        suffix
    };
    p.extend_from_slice(mark);
    if n > 1 {
        p.extend_from_slice((n - 1).to_string().as_bytes());
        p.extend_from_slice(mark);
    }
    p
}

/// A name in a backup directory (`--backup-dir`, `--suffix SUF`) taken
/// apart: the kept file's own name and the number of its keep (1 for
/// `NAME SUF`, n for `NAME MARK (n-1) MARK`, MARK being SUF, or `~`
/// when SUF is empty), as [`Keeper::keep`] names them. `None`: not a
/// name a keep with this suffix gives.
pub fn parse_backup_name(name: &[u8], suffix: &[u8]) -> Option<(Vec<u8>, u32)> {
    let mark: &[u8] = if suffix.is_empty() { b"~" } else { suffix };
    if let Some(rest) = name.strip_suffix(mark) {
        let digits = rest.iter().rev().take_while(|c| c.is_ascii_digit()).count();
        let (base, num) = rest.split_at(rest.len() - digits);
        if let Some(base) = base.strip_suffix(mark) {
            let k: Option<u32> = std::str::from_utf8(num).ok().and_then(|x| x.parse().ok());
            match k {
                // `NAME MARK k MARK`.
                Some(k) if digits > 0 && !num.starts_with(b"0") && !base.is_empty() => {
                    return Some((base.to_vec(), k + 1));
                }
                _ => {}
            }
        }
    }
    if suffix.is_empty() {
        return (!name.is_empty()).then(|| (name.to_vec(), 1));
    }
    let stem = name.strip_suffix(suffix)?;
    (!stem.is_empty()).then(|| (stem.to_vec(), 1))
}

/// Where an entry kept at `path` below `base` is, as records show it:
/// `path` below the destination root, or `base`, `/` and `path`.
pub fn shown(base: &KeepBase, path: &[u8]) -> Vec<u8> {
    let b = match base {
        KeepBase::Root(b) | KeepBase::Abs(b) => b,
    };
    if b.is_empty() {
        return path.to_vec();
    }
    let mut s = b.clone();
    if !s.ends_with(b"/") {
        s.push(b'/');
    }
    s.extend_from_slice(path);
    s
}

/// `(parent, name)` of a `/`-separated path (parent empty at the top).
pub fn split_parent(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&c| c == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
}

/// The clock of kept versions: the system's (with the `fault-injection`
/// feature, which release builds lack, `FERRY_TEST_NOW` in Unix seconds
/// when tests set it).
pub fn clock_now() -> i64 {
    #[cfg(feature = "fault-injection")]
    if let Some(t) = std::env::var("FERRY_TEST_NOW")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return t;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `YYYYMMDD-HHMMSS` (UTC) of Unix seconds.
pub fn stamp(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Unix seconds of a `YYYYMMDD-HHMMSS` stamp (UTC).
pub fn parse_stamp(s: &[u8]) -> Option<i64> {
    if s.len() != 15 || s[8] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = &s[r];
        if !t.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(t).ok()?.parse().ok()
    };
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    Some(days_from_civil(y, m as u32, d as u32) * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// Where a name's extension starts (its last `.`, not the first byte):
/// versions keep it last so that they open with the same application.
fn ext_start(name: &[u8]) -> usize {
    match name.iter().rposition(|&c| c == b'.') {
        Some(i) if i > 0 => i,
        _ => name.len(),
    }
}

/// The name of a version of `name` kept at `stamp` ([`stamp`]):
/// `stem~STAMP.ext`, with `-n` after the stamp for the n-th (n > 1) version
/// of that second.
pub fn version_name(name: &[u8], stamp: &str, n: u32) -> Vec<u8> {
    let e = ext_start(name);
    let mut v = Vec::with_capacity(name.len() + stamp.len() + 8);
    v.extend_from_slice(&name[..e]);
    v.push(b'~');
    v.extend_from_slice(stamp.as_bytes());
    if n > 1 {
        v.extend_from_slice(format!("-{n}").as_bytes());
    }
    v.extend_from_slice(&name[e..]);
    v
}

/// A version's name taken apart: the file's own name, the time it was
/// kept (Unix seconds) and its number within that second (1 for the
/// first).
pub fn parse_version_name(v: &[u8]) -> Option<(Vec<u8>, i64, u32)> {
    // The last `~` followed by a stamp is the tag.
    let mut from = v.len();
    while let Some(i) = v[..from].iter().rposition(|&c| c == b'~') {
        from = i;
        let rest = &v[i + 1..];
        let Some(t) = rest.get(..15).and_then(parse_stamp) else {
            continue;
        };
        let mut j = 15;
        let mut n = 1u32;
        if rest.get(j) == Some(&b'-') {
            let k = rest[j + 1..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count();
            if k == 0 {
                continue;
            }
            match std::str::from_utf8(&rest[j + 1..j + 1 + k])
                .ok()
                .and_then(|s| s.parse().ok())
            {
                Some(x) if x > 1 => n = x,
                _ => continue,
            }
            j += 1 + k;
        }
        let ext = &rest[j..];
        if !ext.is_empty() && (ext[0] != b'.' || ext[1..].contains(&b'.')) {
            continue;
        }
        let mut name = v[..i].to_vec();
        name.extend_from_slice(ext);
        if name.is_empty() || ext_start(&name) != i {
            continue;
        }
        return Some((name, t, n));
    }
    None
}

// Howard Hinnant's civil-date algorithms (public domain).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stamps_are_utc_calendar_times() {
        assert_eq!(stamp(0), "19700101-000000");
        assert_eq!(stamp(1_795_624_423), "20261125-163343");
        assert_eq!(parse_stamp(b"20261125-163343"), Some(1_795_624_423));
        assert_eq!(parse_stamp(b"20261325-163343"), None);
        assert_eq!(parse_stamp(b"2026012-5163343"), None);
    }

    #[test]
    fn version_names_keep_the_extension_last() {
        let s = stamp(1_795_624_423);
        assert_eq!(version_name(b"a.txt", &s, 1), b"a~20261125-163343.txt");
        assert_eq!(
            version_name(b"a.tar.gz", &s, 2),
            b"a.tar~20261125-163343-2.gz"
        );
        assert_eq!(version_name(b".bashrc", &s, 1), b".bashrc~20261125-163343");
        assert_eq!(version_name(b"noext", &s, 1), b"noext~20261125-163343");
        assert_eq!(parse_version_name(b"a.txt"), None);
        assert_eq!(parse_version_name(b"a~2026.txt"), None);
    }

    proptest! {
        #[test]
        fn version_names_parse_back(
            name in proptest::collection::vec(prop_oneof![Just(b'.'), Just(b'~'), Just(b'-'), b'0'..=b'9', b'a'..=b'c', 0x80u8..=0xff], 1..12),
            t in 0i64..4_102_444_800,
            n in 1u32..5,
        ) {
            let v = version_name(&name, &stamp(t), n);
            prop_assert_eq!(parse_version_name(&v), Some((name.clone(), t, n)));
        }

        #[test]
        fn stamps_parse_back(t in 0i64..4_102_444_800) {
            prop_assert_eq!(parse_stamp(stamp(t).as_bytes()), Some(t));
        }
    }

    #[test]
    fn backup_names_parse_back() {
        for suffix in [&b""[..], b"~", b".bak"] {
            for name in [&b"f"[..], b"a.txt", b"x~", b"n1"] {
                for n in 1..4 {
                    let kept = numbered(name, suffix, n);
                    assert_eq!(
                        parse_backup_name(&kept, suffix),
                        Some((name.to_vec(), n)),
                        "{:?} {:?} {n}",
                        String::from_utf8_lossy(name),
                        String::from_utf8_lossy(suffix)
                    );
                }
            }
        }
        assert_eq!(parse_backup_name(b"f", b".bak"), None);
        assert_eq!(parse_backup_name(b".bak", b".bak"), None);
    }

    #[test]
    fn targets_follow_the_rule() {
        let k = Keeper::new(
            KeepRule::BackupDir {
                base: KeepBase::Root(b"../old".to_vec()),
                suffix: b".bak".to_vec(),
            },
            0,
        );
        assert_eq!(
            k.target(b"d/f", 1),
            (KeepBase::Root(b"../old".to_vec()), b"d/f.bak".to_vec())
        );
        assert_eq!(k.target(b"d/f", 3).1, b"d/f.bak2.bak".to_vec());
        let k = Keeper::new(
            KeepRule::BackupDir {
                base: KeepBase::Abs(b"/old".to_vec()),
                suffix: vec![],
            },
            0,
        );
        assert_eq!(k.target(b"d/f", 1).1, b"d/f".to_vec());
        assert_eq!(k.target(b"d/f", 2).1, b"d/f~1~".to_vec());
        let k = Keeper::new(KeepRule::Suffix(b"~".to_vec()), 0);
        assert_eq!(
            k.target(b"d/f", 1),
            (KeepBase::Root(vec![]), b"d/f~".to_vec())
        );
        assert_eq!(k.target(b"d/f", 2).1, b"d/f~1~".to_vec());
        assert_eq!(k.target(b"d/f", 11).1, b"d/f~10~".to_vec());
        assert!(k.protects(b"f~1~"));
        assert!(k.protects(b"f~") && !k.protects(b"~") && !k.protects(b"f"));
        let k = Keeper::new(KeepRule::Versions, 0);
        assert_eq!(
            k.target(b"d/f.txt", 1),
            (
                KeepBase::Root(VERSIONS_DIR.to_vec()),
                b"d/f~19700101-000000.txt".to_vec()
            )
        );
    }
}
