//! Kept versions (`--versions`): which of them stay ([`retained`], the
//! retention policy as a pure function of their times and the clock),
//! finding them in a replica ([`collect`]) and pruning them ([`prune`]),
//! over any [`Store`].
//!
//! Versions live in [`VERSIONS_DIR`] at the replica's root, below the
//! path of the file's directory, named `stem~YYYYMMDD-HHMMSS[-n].ext`
//! ([`version_name`](crate::keep::version_name)); names that do not parse
//! are never touched.
//!
//! Retention, for the versions of one file, by their age (`now` minus the
//! time they were kept):
//! - `--keep-days D`: none older than D days (an age above `D * 86400`).
//! - `--keep N`: the N newest.
//! - `--keep staggered`: every version less than an hour old; then the
//!   newest of each hour for a day, of each day for 30 days, of each week
//!   after (buckets counted from `now`). The newest version is thus always
//!   kept (unless `--keep-days` drops it).
//!
//! The rules combine: a version stays when every rule given keeps it.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;

use crate::entry::{join, Kind, Listing, Meta};
use crate::keep::{parse_version_name, Retention, VERSIONS_DIR};
use crate::store::{ListError, Store};

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;
const WEEK: i64 = 7 * DAY;

/// The staggered bucket of a version of age `age` (seconds): `None` when
/// every version of that age is kept (less than an hour old, or kept in
/// the future of a clock set back), else (tier, index): versions in one
/// bucket are thinned to the newest.
pub fn staggered_bucket(age: i64) -> Option<(u8, i64)> {
    if age < HOUR {
        None
    } else if age < DAY {
        Some((1, age / HOUR))
    } else if age < 30 * DAY {
        Some((2, age / DAY))
    } else {
        Some((3, age / WEEK))
    }
}

/// Which of the versions of one file stay under `r` at `now` (Unix
/// seconds): `versions` are (time kept, number within that second), in
/// any order; the answer is in the same order. "Newer" is a later time,
/// then a higher number (then a later position, for duplicates).
pub fn retained(versions: &[(i64, u32)], now: i64, r: &Retention) -> Vec<bool> {
    let mut order: Vec<usize> = (0..versions.len()).collect();
    // Newest first.
    order.sort_by(|&a, &b| (versions[b], b).cmp(&(versions[a], a)));
    let mut keep = vec![false; versions.len()];
    let mut kept = 0u64;
    let mut buckets: HashMap<(u8, i64), ()> = HashMap::new();
    for i in order {
        let age = now.saturating_sub(versions[i].0);
        if let Some(d) = r.days {
            if age > i64::from(d) * DAY {
                continue;
            }
        }
        if r.staggered {
            if let Some(b) = staggered_bucket(age) {
                // A newer version holds this bucket already.
                if buckets.insert(b, ()).is_some() {
                    continue;
                }
            }
        }
        if let Some(n) = r.last {
            if kept >= u64::from(n) {
                continue;
            }
        }
        kept += 1;
        keep[i] = true;
    }
    keep
}

/// True when `r` keeps every version (nothing to prune).
pub fn keeps_all(r: &Retention) -> bool {
    r.last.is_none() && !r.staggered && r.days.is_none()
}

/// One kept version of a file.
#[derive(Clone, Debug)]
pub struct Version {
    /// The file's directory, below the replica root (empty at the top).
    pub dir: Vec<u8>,
    /// The file's own name.
    pub name: Vec<u8>,
    /// The version's name in `VERSIONS_DIR/dir`.
    pub vname: Vec<u8>,
    /// When it was kept (Unix seconds, UTC).
    pub kept: i64,
    /// Its number within that second (1 for the first).
    pub n: u32,
    /// Its metadata (size, mtime, mode) as listed.
    pub meta: Meta,
    /// Kept by `--backup-dir`: `vname` is at `dir` below the backup
    /// directory, not in [`VERSIONS_DIR`].
    pub backup: bool,
}

impl Version {
    /// The file's path below the replica root.
    pub fn rel(&self) -> Vec<u8> {
        join(&self.dir, &self.name)
    }

    /// The version's path below the replica root (below the backup
    /// directory for a [`Version::backup`]).
    pub fn path(&self) -> Vec<u8> {
        if self.backup {
            return join(&self.dir, &self.vname);
        }
        let mut p = VERSIONS_DIR.to_vec();
        for part in [&self.dir, &self.vname] {
            if !part.is_empty() {
                p.push(b'/');
                p.extend_from_slice(part);
            }
        }
        p
    }
}

fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a name"))
}

/// True when the directory `dir` (of `store`) holds a directory named
/// [`VERSIONS_DIR`]: a replica's root with versions. Listed rather than
/// stat'ed: an object store has no entry for a prefix.
pub fn has_versions_dir<S: Store>(store: &S, dir: &S::Dir) -> io::Result<bool> {
    let mut l = Listing::new();
    let mut errors = Vec::new();
    store.list(dir, b"", &mut l, &mut errors)?;
    Ok(l.entries()
        .iter()
        .any(|e| l.name(e) == VERSIONS_DIR && e.meta.kind == Kind::Dir))
}

/// Open `VERSIONS_DIR/sub` below the replica root `root` (`sub`:
/// `/`-separated, empty for the versions directory itself); `None` when
/// it does not exist.
pub fn open_versions_dir<S: Store>(
    store: &S,
    root: &S::Dir,
    sub: &[u8],
) -> io::Result<Option<S::Dir>> {
    let mut d = match store.open_dir(root, &cstr(VERSIONS_DIR)?) {
        Ok(d) => d,
        Err(e) if missing(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    for part in sub.split(|&c| c == b'/').filter(|p| !p.is_empty()) {
        d = match store.open_dir(&d, &cstr(part)?) {
            Ok(d) => d,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
    }
    Ok(Some(d))
}

fn missing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// The versions in the versions directory `vdir` (at `dir`, the path of
/// the files' directory below the replica root), of the file named
/// `only` or of every file; with `deep`, those of subdirectories too.
/// Names that do not parse are left out; problems listing a directory go
/// to `notes` (one line each) and the rest goes on.
pub fn collect<S: Store>(
    store: &S,
    vdir: &S::Dir,
    dir: &[u8],
    only: Option<&[u8]>,
    deep: bool,
    out: &mut Vec<Version>,
    notes: &mut Vec<String>,
) {
    let mut l = Listing::new();
    let mut errors: Vec<ListError> = Vec::new();
    let listed = join(VERSIONS_DIR, dir);
    if let Err(e) = store.list(vdir, &listed, &mut l, &mut errors) {
        notes.push(format!("{}: {e}", String::from_utf8_lossy(&listed)));
        return;
    }
    for e in errors {
        notes.push(format!(
            "{}: {}",
            String::from_utf8_lossy(&join(&listed, &e.name)),
            e.err
        ));
    }
    for e in l.entries() {
        let vname = l.name(e);
        // A name an object store may list that is no name in a directory
        // (`..`, empty, holding a `/`): never a version, never walked.
        if vname.is_empty() || vname == b"." || vname == b".." || vname.contains(&b'/') {
            continue;
        }
        if e.meta.kind == Kind::Dir {
            if deep {
                let sub = join(dir, vname);
                match store.open_dir(vdir, l.cname(e)) {
                    Ok(d) => collect(store, &d, &sub, only, deep, out, notes),
                    Err(err) => notes.push(format!(
                        "{}: {err}",
                        String::from_utf8_lossy(&join(VERSIONS_DIR, &sub))
                    )),
                }
            }
            continue;
        }
        let Some((name, kept, n)) = parse_version_name(vname) else {
            continue;
        };
        if only.is_some_and(|o| o != name.as_slice()) {
            continue;
        }
        out.push(Version {
            dir: dir.to_vec(),
            name,
            vname: vname.to_vec(),
            kept,
            n,
            meta: e.meta,
            backup: false,
        });
    }
}

/// When one state of a file held, for `--at`: `[start, end)` in Unix
/// seconds (`end`: `None` for the current file, which holds until now).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// From when it was written.
    pub start: i64,
    /// To when it was replaced or deleted (a version's keep time).
    pub end: Option<i64>,
}

/// The validity spans of a file's states: `states` are its kept versions
/// oldest first (by time kept, then number), each as (its mtime, when it
/// was kept), then, when the file exists, the current file as (its
/// mtime, `None`).
///
/// A state holds from when it was written to when it was replaced. When
/// it was written is its mtime, unless that cannot be true: a state is
/// written after the one before it was in place, so an mtime at or
/// before that moment (a restored version, `cp -p`, `tar x`, a clock
/// set back) says nothing, and the state counts from the moment it
/// replaced the one before (that one's keep time). A state written
/// after the one before it was kept leaves a gap: the file did not
/// exist in between (it was deleted, then made anew).
pub fn spans(states: &[(i64, Option<i64>)]) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::with_capacity(states.len());
    for (j, &(mtime, end)) in states.iter().enumerate() {
        // When the state before was surely in place: written (its own
        // start), and still there when the one before it was replaced.
        let bound = match j {
            0 => None,
            1 => Some(out[0].start),
            _ => Some(out[j - 1].start.max(states[j - 2].1.unwrap_or(i64::MIN))),
        };
        let mut start = match (bound, j.checked_sub(1).and_then(|i| states[i].1)) {
            (Some(b), Some(replaced)) if mtime <= b => replaced,
            _ => mtime,
        };
        if let Some(e) = end {
            start = start.min(e);
        }
        out.push(Span { start, end });
    }
    out
}

/// Which of the states (as given to [`spans`]) the file had at `at`: the
/// newest whose span holds `at` (where two do, the file was rewritten
/// before the run that kept the older one: the newer is what the file
/// held); `None` when none does (the file did not exist then, or nothing
/// kept goes back that far).
pub fn state_at(states: &[(i64, Option<i64>)], at: i64) -> Option<usize> {
    spans(states)
        .iter()
        .rposition(|s| s.start <= at && s.end.is_none_or(|e| at < e))
}

/// What [`prune`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Versions removed.
    pub pruned: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Versions that stay.
    pub kept: u64,
    /// What could not be done, one line each (the rest went on).
    pub notes: Vec<String>,
}

/// Remove the versions `r` drops at `now` from the replica of `store`
/// (in [`VERSIONS_DIR`] at its root), and the directories that leaves
/// empty. Never fails: whatever goes wrong becomes a note, and the rest
/// goes on. Nothing to do when there is no versions directory or `r`
/// keeps everything.
pub fn prune<S: Store>(store: &S, now: i64, r: &Retention) -> PruneReport {
    let mut rep = PruneReport::default();
    if keeps_all(r) {
        return rep;
    }
    let root = match store.open_root() {
        Ok(Some((d, _))) => d,
        Ok(None) => return rep,
        Err(e) => {
            rep.notes.push(format!("pruning versions: the root: {e}"));
            return rep;
        }
    };
    let vdir = match open_versions_dir(store, &root, b"") {
        Ok(Some(d)) => d,
        Ok(None) => return rep,
        Err(e) => {
            rep.notes.push(format!(
                "pruning versions: {}: {e}",
                String::from_utf8_lossy(VERSIONS_DIR)
            ));
            return rep;
        }
    };
    prune_dir(store, &vdir, VERSIONS_DIR, now, r, &mut rep, true);
    rep
}

/// The versions of one file in a listing: (entry index, (time, number)).
type Group = Vec<(usize, (i64, u32))>;

/// Prune only the versions in the directories `subs` of [`VERSIONS_DIR`]
/// (paths below it, `/`-separated; empty: its top), not their
/// subdirectories, and remove no directory: what a run that kept
/// versions there needs, without a walk of every version (a watch's
/// runs). Never fails, as [`prune`].
pub fn prune_in<S: Store>(store: &S, now: i64, r: &Retention, subs: &[Vec<u8>]) -> PruneReport {
    let mut rep = PruneReport::default();
    if keeps_all(r) || subs.is_empty() {
        return rep;
    }
    let root = match store.open_root() {
        Ok(Some((d, _))) => d,
        Ok(None) => return rep,
        Err(e) => {
            rep.notes.push(format!("pruning versions: the root: {e}"));
            return rep;
        }
    };
    let mut subs = subs.to_vec();
    subs.sort();
    subs.dedup();
    for sub in subs {
        let rel = join(VERSIONS_DIR, &sub);
        match open_versions_dir(store, &root, &sub) {
            Ok(Some(d)) => {
                prune_dir(store, &d, &rel, now, r, &mut rep, false);
            }
            Ok(None) => {}
            Err(e) => rep.notes.push(format!(
                "pruning versions: {}: {e}",
                String::from_utf8_lossy(&rel)
            )),
        }
    }
    rep
}

/// Prune one directory of versions (`rel`: its path below the root) and,
/// with `deep`, its subdirectories; true when it held entries and holds
/// none now.
fn prune_dir<S: Store>(
    store: &S,
    dir: &S::Dir,
    rel: &[u8],
    now: i64,
    r: &Retention,
    rep: &mut PruneReport,
    deep: bool,
) -> bool {
    let show = |name: &[u8]| String::from_utf8_lossy(&join(rel, name)).into_owned();
    let mut l = Listing::new();
    let mut errors = Vec::new();
    if let Err(e) = store.list(dir, rel, &mut l, &mut errors) {
        rep.notes
            .push(format!("pruning versions: {}: {e}", show(b"")));
        return false;
    }
    for e in &errors {
        rep.notes
            .push(format!("pruning versions: {}: {}", show(&e.name), e.err));
    }
    let had = l.len() + errors.len();
    let mut left = had;
    // The versions of each file, by the file's name.
    let mut groups: HashMap<Vec<u8>, Group> = HashMap::new();
    for (i, e) in l.entries().iter().enumerate() {
        if e.meta.kind == Kind::Dir {
            continue;
        }
        if let Some((name, t, n)) = parse_version_name(l.name(e)) {
            groups.entry(name).or_default().push((i, (t, n)));
        }
    }
    let entries = l.entries();
    for group in groups.values() {
        let times: Vec<(i64, u32)> = group.iter().map(|g| g.1).collect();
        for (&(i, _), keep) in group.iter().zip(retained(&times, now, r)) {
            if keep {
                rep.kept += 1;
                continue;
            }
            let e = &entries[i];
            match store.remove(dir, l.cname(e), false) {
                Ok(_) => {
                    rep.pruned += 1;
                    rep.bytes += e.meta.size;
                    left -= 1;
                }
                Err(err) => rep.notes.push(format!(
                    "pruning versions: {}: not removed: {err}",
                    show(l.name(e))
                )),
            }
        }
    }
    for e in entries.iter().filter(|e| deep && e.meta.kind == Kind::Dir) {
        let name = l.name(e);
        let sub = join(rel, name);
        let emptied = match store.open_dir(dir, l.cname(e)) {
            Ok(d) => prune_dir(store, &d, &sub, now, r, rep, true),
            Err(err) => {
                rep.notes
                    .push(format!("pruning versions: {}: {err}", show(name)));
                false
            }
        };
        if emptied {
            match store.rmdir(dir, l.cname(e)) {
                Ok(()) => left -= 1,
                Err(err) => rep.notes.push(format!(
                    "pruning versions: {}: not removed: {err}",
                    show(name)
                )),
            }
        }
    }
    had > 0 && left == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The policy, said directly: a version stays when it is young enough,
    /// no newer version shares its staggered bucket, and (with `--keep N`)
    /// fewer than N newer versions stay.
    fn reference(v: &[(i64, u32)], now: i64, r: &Retention) -> Vec<bool> {
        let newer = |j: usize, i: usize| (v[j], j) > (v[i], i);
        let young = |i: usize| r.days.is_none_or(|d| now - v[i].0 <= d as i64 * 86_400);
        let bucket = |i: usize| {
            let age = now - v[i].0;
            if age < 3600 {
                None
            } else if age < 86_400 {
                Some(("hour", age / 3600))
            } else if age < 30 * 86_400 {
                Some(("day", age / 86_400))
            } else {
                Some(("week", age / (7 * 86_400)))
            }
        };
        let thinned = |i: usize| {
            !r.staggered
                || bucket(i).is_none()
                || !(0..v.len())
                    .any(|j| j != i && young(j) && newer(j, i) && bucket(j) == bucket(i))
        };
        let pre: Vec<bool> = (0..v.len()).map(|i| young(i) && thinned(i)).collect();
        (0..v.len())
            .map(|i| {
                pre[i]
                    && r.last.is_none_or(|n| {
                        (0..v.len()).filter(|&j| pre[j] && newer(j, i)).count() < n as usize
                    })
            })
            .collect()
    }

    fn retention() -> impl Strategy<Value = Retention> {
        (
            proptest::option::of(1u32..6),
            any::<bool>(),
            proptest::option::of(0u32..60),
        )
            .prop_map(|(last, staggered, days)| Retention {
                last,
                staggered,
                days,
            })
    }

    /// Version times spread from the future to a year back, clustered
    /// enough to share buckets.
    fn versions() -> impl Strategy<Value = Vec<(i64, u32)>> {
        proptest::collection::vec(
            (
                prop_oneof![
                    -600i64..7200,
                    0i64..3 * 86_400,
                    0i64..365 * 86_400,
                    Just(3600i64),
                    Just(86_400i64),
                ],
                1u32..3,
            ),
            0..40,
        )
        .prop_map(|mut v| {
            v.sort();
            v.dedup();
            v
        })
    }

    const NOW: i64 = 1_795_624_423;

    proptest! {
        #[test]
        fn kept_is_what_the_policy_says(ages in versions(), r in retention(), shuffle in any::<u64>()) {
            let mut v: Vec<(i64, u32)> = ages.iter().map(|&(a, n)| (NOW - a, n)).collect();
            // Any order in, the same order out.
            let len = v.len().max(1);
            v.rotate_left(shuffle as usize % len);
            let kept = retained(&v, NOW, &r);
            prop_assert_eq!(&kept, &reference(&v, NOW, &r));
            let count = kept.iter().filter(|&&k| k).count();
            if let Some(n) = r.last {
                prop_assert!(count <= n as usize);
            }
            if keeps_all(&r) {
                prop_assert_eq!(count, v.len());
            }
            // The newest stays unless it is too old for --keep-days.
            if let Some(newest) = (0..v.len()).max_by_key(|&i| (v[i], i)) {
                let too_old = r.days.is_some_and(|d| NOW - v[newest].0 > d as i64 * 86_400);
                prop_assert_eq!(kept[newest], !too_old);
            }
            // Pruning twice is pruning once.
            let rest: Vec<(i64, u32)> = v.iter().zip(&kept).filter(|(_, &k)| k).map(|(x, _)| *x).collect();
            prop_assert!(retained(&rest, NOW, &r).iter().all(|&k| k));
        }
    }

    #[test]
    fn state_at_is_the_state_whose_span_holds_the_time() {
        // Written at 100 (A), rewritten at 150 (B), synced at 200 (A
        // kept), rewritten at 250 (C, current), synced at 300 (B kept).
        let s = [(100, Some(200)), (150, Some(300)), (250, None)];
        let at = |t| state_at(&s, t);
        assert_eq!(at(99), None);
        assert_eq!(at(100), Some(0));
        assert_eq!(at(149), Some(0));
        // The working tree held B from 150, though the replica still held
        // A until 200.
        assert_eq!(at(150), Some(1));
        assert_eq!(at(210), Some(1));
        assert_eq!(at(260), Some(2));
        assert_eq!(at(i64::MAX), Some(2));
        // Deleted at 200, made anew at 400: nothing in between.
        let s = [(100, Some(200)), (400, None)];
        assert_eq!(state_at(&s, 300), None);
        assert_eq!(state_at(&s, 400), Some(1));
        // Deleted and never made again.
        assert_eq!(state_at(&[(100, Some(200))], 250), None);
        // A restore at 500 of the version written at 100: the current
        // file has the old mtime; it holds from 500, what it replaced
        // (written at 300) until then.
        let s = [(100, Some(200)), (300, Some(500)), (100, None)];
        assert_eq!(state_at(&s, 400), Some(1));
        assert_eq!(state_at(&s, 150), Some(0));
        assert_eq!(state_at(&s, 600), Some(2));
        // A deleted file restored (its mtime as the version had it): it
        // did not exist between its deletion and the restore.
        let s = [(100, Some(200)), (100, None)];
        assert_eq!(spans(&s)[1].start, 200);
        // An mtime in the future of its keep: held only at its keep.
        assert_eq!(spans(&[(900, Some(800))])[0].start, 800);
    }

    #[test]
    fn staggered_keeps_one_per_bucket() {
        let r = Retention {
            staggered: true,
            ..Retention::default()
        };
        let v = [
            (NOW - 10, 1),
            (NOW - 20, 1),             // both in the last hour: kept
            (NOW - 3600 - 5, 1),       // hour 1: the newer of two
            (NOW - 3600 - 50, 1),      // dropped
            (NOW - 2 * 86_400, 1),     // day 2
            (NOW - 2 * 86_400 - 9, 1), // dropped
            (NOW - 60 * 86_400, 1),    // week 8
            (NOW - 61 * 86_400, 1),    // week 8 as well: dropped
        ];
        assert_eq!(
            retained(&v, NOW, &r),
            [true, true, true, false, true, false, true, false]
        );
        let r = Retention {
            last: Some(2),
            days: Some(1),
            ..Retention::default()
        };
        assert_eq!(
            retained(&v, NOW, &r),
            [true, true, false, false, false, false, false, false]
        );
    }
}
