//! Plan: the three-way merge of both scans with the journal into a list of
//! actions ([`Item`]s, in key order), then the rules that need more than
//! one path:
//!
//! - **Directories.** A directory that must exist on both sides after the
//!   run (because something inside it does) is never deleted: a deletion
//!   becomes a re-creation on the side that deleted it (new files added
//!   inside a directory deleted on the other side survive), and a file that
//!   was to replace it becomes a conflict copy.
//! - **Renames.** A path new on side X whose inode (or size and mtime,
//!   where the store has no inodes) is that of a path X no longer has, while
//!   the other side still holds that path unchanged, is replayed as a rename
//!   on the other side instead of copy + delete, but only once its bytes
//!   are proven those of the old path's synced copy on the other side (an
//!   inode is reused by a new file as soon as the old one is deleted).
//! - **Conflicts** get their names: `stem (conflict YYYY-MM-DD HHMM from B).ext`
//!   (UTC), made unique among every name either side holds, and short
//!   enough for any file system (the stem is shortened).
//!
//! Only paths with something to do become items: a no-op run allocates
//! nothing per entry.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};

use ferry_engine::{Kind, Listing, Meta};

use crate::journal::DirRecs;
use crate::reconcile::{reconcile, unchanged, Decision, Side, Synced};
use crate::tree::{name_of, parent_key, under_any};

/// What to do with one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Act {
    /// Contents must be compared first (resolved before [`finish`]).
    Compare,
    /// `--checksum`: in sync by metadata; contents must still be compared
    /// (equal: [`Act::Record`], else a conflict; resolved before [`finish`]).
    Check,
    /// Both sides agree: only the journal learns it.
    Record,
    /// Gone on both sides: drop the journal's record.
    Forget,
    /// Copy `from`'s entry to the other side (a directory: create it).
    Copy {
        /// The side whose entry wins.
        from: Side,
    },
    /// Set `from`'s permission bits on the other side.
    Meta {
        /// The side whose mode wins.
        from: Side,
    },
    /// Delete the entry on `on` (unchanged there since the last sync).
    Delete {
        /// The side to delete on.
        on: Side,
    },
    /// Replay on `on` a rename made on the other side: the entry of item
    /// `from` (a path that vanished there) moves to this item's path.
    Rename {
        /// The side to rename on.
        on: Side,
        /// Index of the item of the old path.
        from: usize,
    },
    /// The old path of a rename (done by the item that names it).
    RenamedAway,
    /// Keep both: the `loser`'s entry is renamed to `name` (a key) on its
    /// own side, then each side gets the other's version.
    Conflict {
        /// The side whose version moves to the conflict name.
        loser: Side,
        /// Key of the conflict name.
        name: Vec<u8>,
    },
    /// Left alone this run (its comparison failed; already reported).
    Skip,
}

/// One path with something to do.
#[derive(Clone, Debug)]
pub struct Item {
    /// The path's key (see [`crate::tree::key_of`]).
    pub key: Vec<u8>,
    /// The journal's record.
    pub j: Option<Synced>,
    /// Side A's entry now.
    pub a: Option<Meta>,
    /// Side B's entry now.
    pub b: Option<Meta>,
    /// The action.
    pub act: Act,
}

impl Item {
    /// A side's entry now.
    pub fn side(&self, s: Side) -> Option<&Meta> {
        match s {
            Side::A => self.a.as_ref(),
            Side::B => self.b.as_ref(),
        }
    }

    /// True when the path holds an entry on both sides after the action.
    fn exists_after(&self) -> bool {
        match self.act {
            Act::Delete { .. } | Act::Forget | Act::RenamedAway => false,
            Act::Skip => self.a.is_some() || self.b.is_some(),
            _ => true,
        }
    }
}

/// A rename candidate to prove: (side X of the new path, new key, old key).
/// It is a rename only if X's new path holds the bytes of the old path on
/// the other side (the synced copy of what X had there).
pub type Candidate = (Side, Vec<u8>, Vec<u8>);

/// Checks rename candidates (all at once, so they can be checked in
/// parallel): one answer per candidate, true when the bytes agree.
pub type Verify<'a> = &'a dyn Fn(&[Candidate]) -> Vec<bool>;

/// The plan of a run.
#[derive(Debug, Default)]
pub struct Plan {
    /// Paths with something to do, in key order.
    pub items: Vec<Item>,
    /// Entries listed on A and B.
    pub scanned: u64,
    /// Paths in sync that need nothing.
    pub unchanged: u64,
    /// Files and symlinks to delete on A and on B.
    pub deletes: [u64; 2],
    /// Paths found in sync whose record the scan wrote (or, in a dry run,
    /// would have written) itself.
    pub recorded: u64,
    /// Files and symlinks the journal knows (the base of the deletion limit).
    pub known: [u64; 2],
    /// Directories the journal knows.
    pub known_dirs: u64,
    /// Directories to delete on A and on B.
    pub dir_deletes: [u64; 2],
    /// What the stores are like.
    pub sides: Sides,
}

/// What the merge needs to know about the stores.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sides {
    /// Per side: directories are implicit (an object store's key prefixes):
    /// an empty one cannot be seen, so a known directory that is not seen
    /// is not taken as deleted.
    pub implicit_dirs: [bool; 2],
    /// Per side: entries have inodes (`Meta::ino`, kept by a rename);
    /// otherwise renames are found by size, mtime and content.
    pub inodes: [bool; 2],
}

/// What merging a directory needs besides its lists.
pub struct Ctx<'a> {
    /// What the stores are like.
    pub sides: Sides,
    /// Keys unreadable on A and on B, with everything below them (looked
    /// at only for paths with something to do).
    pub unknown: [&'a Mutex<Vec<Vec<u8>>>; 2],
    /// Keys listed on A and on B beside an error of the same name: an S3
    /// object `a` beside objects `a/...` is listed as the directory `a`
    /// and its object `a` reported (and left alone). The directory and
    /// what is below it are synced; the path itself only where every entry
    /// of it (each side's, the journal's) is a directory, so nothing writes
    /// or removes a file of that name.
    pub shadowed: [&'a Mutex<Vec<Vec<u8>>>; 2],
    /// `--checksum`: files in sync by metadata get their bytes compared.
    pub checksum: bool,
}

/// What merging one directory found.
#[derive(Debug, Default)]
pub struct DirMerged {
    /// Its children with something to do.
    pub items: Vec<Item>,
    /// Its children in sync.
    pub unchanged: u64,
    /// Journal records visited.
    pub seen_j: usize,
    /// Child directories to merge next: name, and whether A and B list it.
    pub subdirs: Vec<(Vec<u8>, [bool; 2])>,
}

/// What [`reconcile`] decides for one child (its record `vj`, its entries
/// `va`, `vb`), and whether its bytes are compared (`--checksum`, both
/// files, nothing else to do).
fn decide(
    cx: &Ctx<'_>,
    vj: Option<&Synced>,
    va: &Option<Meta>,
    vb: &Option<Meta>,
) -> (Decision, bool) {
    // An object's version fingerprint (`Meta::version`) is not a
    // change by itself (a rewrite with the same size, mtime and mode
    // changes nothing ferry syncs), so the rules do not see it; but a
    // record lacking the inode a side now reports, or holding another
    // version than the listed one, learns it, so the next run can
    // trust the listing without asking for the object's metadata.
    let mut d = reconcile(vj, va.as_ref(), vb.as_ref());
    let learn = |now: &Option<Meta>, then: Option<&Meta>, _: Side| {
        let (Some(n), Some(t)) = (now, then) else {
            return false;
        };
        n.kind == Kind::File
            && t.kind == Kind::File
            && ((n.ino != 0 && t.ino == 0) || (n.version != 0 && t.version != n.version))
    };
    let files = |m: &Option<Meta>| m.is_some_and(|m| m.kind == Kind::File);
    let check = cx.checksum && d == Decision::Keep && files(va) && files(vb);
    if d == Decision::Keep
        && !check
        && (learn(va, vj.map(|r| &r.a), Side::A) || learn(vb, vj.map(|r| &r.b), Side::B))
    {
        d = Decision::Record;
    }
    (d, check)
}

/// Merge one directory (key `key`): its listings on A and B (empty where a
/// side has no such directory) with the journal's records of its children
/// (`recs`), by name: every child where something must be done or
/// recorded, with the decision of [`reconcile`]; a child in sync costs no
/// allocation.
pub fn merge_dir(
    cx: &Ctx<'_>,
    key: &[u8],
    la: &Listing,
    lb: &Listing,
    recs: &DirRecs,
    out: &mut DirMerged,
) {
    let mut lj = recs.iter().peekable();
    let (ea, eb) = (la.entries(), lb.entries());
    let mut ck = key.to_vec();
    if !ck.is_empty() {
        ck.push(0);
    }
    let base = ck.len();
    let (mut i, mut k) = (0, 0);
    loop {
        // The smallest name among the three heads.
        let na = (i < ea.len()).then(|| la.name(&ea[i]));
        let nb = (k < eb.len()).then(|| lb.name(&eb[k]));
        let nj = lj.peek().map(|(n, _)| *n);
        let Some(name) = [na, nb, nj].into_iter().flatten().min() else {
            break;
        };
        let va = (na == Some(name)).then(|| ea[i].meta);
        let vb = (nb == Some(name)).then(|| eb[k].meta);
        let vj = if nj == Some(name) {
            out.seen_j += 1;
            lj.next().map(|(_, s)| s)
        } else {
            None
        };
        i += va.is_some() as usize;
        k += vb.is_some() as usize;
        let is_dir = |m: &Option<Meta>| m.is_some_and(|m| m.kind == Kind::Dir);
        let listed = [is_dir(&va), is_dir(&vb)];
        let implicit = |now: Option<Meta>, s: Side| match (now, &vj) {
            (None, Some(r))
                if cx.sides.implicit_dirs[s as usize] && r.side(s).kind == Kind::Dir =>
            {
                Some(*r.side(s))
            }
            _ => now,
        };
        let (va, vb) = (implicit(va, Side::A), implicit(vb, Side::B));
        if is_dir(&va) || is_dir(&vb) || vj.is_some_and(|r| r.a.kind == Kind::Dir) {
            out.subdirs.push((name.to_vec(), listed));
        }
        let (d, check) = decide(cx, vj.as_ref(), &va, &vb);
        let files = |m: &Option<Meta>| m.is_some_and(|m| m.kind == Kind::File);
        if d == Decision::Keep && !check {
            out.unchanged += 1;
            continue;
        }
        ck.truncate(base);
        ck.extend_from_slice(name);
        // Unreadable here or above on either side: judge nothing.
        if cx.unknown.iter().any(|u| {
            let u = u.lock();
            // The root's key (empty) holds every key.
            !u.is_empty() && (u.iter().any(Vec::is_empty) || under_any(&u, &ck))
        }) {
            continue;
        }
        let only_dirs = [va, vb, vj.map(|r| r.a), vj.map(|r| r.b)]
            .iter()
            .flatten()
            .all(|m| m.kind == Kind::Dir);
        if !only_dirs && cx.shadowed.iter().any(|u| u.lock().contains(&ck)) {
            continue;
        }
        let act = match d {
            Decision::Keep if check => Act::Check,
            Decision::Keep => unreachable!("continued above"),
            Decision::Record => Act::Record,
            Decision::Forget => Act::Forget,
            Decision::Compare => Act::Compare,
            Decision::Copy { from } => Act::Copy { from },
            Decision::Meta { from } => Act::Meta { from },
            Decision::Delete { on } => Act::Delete { on },
            Decision::Conflict => Act::Conflict {
                loser: Side::B,
                name: Vec::new(),
            },
        };
        let mut it = Item {
            key: ck.clone(),
            j: vj,
            a: va,
            b: vb,
            act,
        };
        // Two files of the same size and mtime seen for the first time (no
        // record) are taken to be equal, as sync's quick check takes them
        // (`--checksum` compares their bytes). Both changed since the last
        // run: their bytes are compared (two writes in one tick of a
        // coarse clock, or on a filesystem of 2 s mtimes, look alike).
        if it.act == Act::Compare
            && !cx.checksum
            && vj.is_none()
            && files(&va)
            && files(&vb)
            && va
                .zip(vb)
                .is_some_and(|(a, b)| a.size == b.size && a.same_mtime(&b))
        {
            it.act = compared(&it, true);
        }
        out.items.push(it);
    }
}

/// Merge both trees (each holding every directory's listing) with the
/// journal, one directory after another: the reference for the merge the
/// walk does as listings arrive ([`crate::tree::scan_merge`]), in tests.
#[cfg(test)]
pub fn merge(
    a: &crate::tree::Tree,
    b: &crate::tree::Tree,
    j: &crate::journal::Snapshot,
    sides: Sides,
) -> Plan {
    use crate::journal::Records;
    let unknown = [Mutex::new(a.unknown.clone()), Mutex::new(b.unknown.clone())];
    let shadowed = [Mutex::new(Vec::new()), Mutex::new(Vec::new())];
    let cx = Ctx {
        sides,
        unknown: [&unknown[0], &unknown[1]],
        shadowed: [&shadowed[0], &shadowed[1]],
        checksum: false,
    };
    let mut plan = Plan {
        scanned: (a.count + b.count) as u64,
        known: [j.files(); 2],
        known_dirs: j.len() as u64 - j.files(),
        sides,
        ..Plan::default()
    };
    let empty = Listing::new();
    let mut merged = HashSet::new();
    let mut todo = vec![Vec::new()];
    let mut orphan_pass = false;
    loop {
        while let Some(key) = todo.pop() {
            if !merged.insert(key.clone()) {
                continue;
            }
            let path = crate::tree::path_of(&key);
            let la = a.dirs.get(&path).unwrap_or(&empty);
            let lb = b.dirs.get(&path).unwrap_or(&empty);
            let mut out = DirMerged::default();
            merge_dir(&cx, &key, la, lb, &j.dir(&key).unwrap(), &mut out);
            plan.items.append(&mut out.items);
            plan.unchanged += out.unchanged;
            for (name, _) in out.subdirs {
                let mut k = key.clone();
                if !k.is_empty() {
                    k.push(0);
                }
                k.extend_from_slice(&name);
                todo.push(k);
            }
        }
        if orphan_pass {
            break;
        }
        orphan_pass = true;
        // Journal records no merge reached (below directories nobody has).
        j.each_dir(&mut |d| {
            if !merged.contains(d) {
                todo.push(d.to_vec());
            }
        })
        .unwrap();
        todo.reverse();
    }
    plan.items.sort_by(|x, y| x.key.cmp(&y.key));
    plan
}

/// What the journal records for a path both sides agree on.
pub fn record_of(it: &Item) -> Synced {
    let (ma, mb) = (it.a.expect("both"), it.b.expect("both"));
    if ma.kind == Kind::Dir {
        Synced {
            a: dir_rec(Some(&ma)),
            b: dir_rec(Some(&mb)),
        }
    } else {
        Synced { a: ma, b: mb }
    }
}

/// Metadata standing for a directory in the journal (only its kind counts).
pub fn dir_rec(m: Option<&Meta>) -> Meta {
    Meta {
        kind: Kind::Dir,
        size: 0,
        mtime_sec: 0,
        mtime_nsec: 0,
        mode: m.map_or(0, |m| m.mode),
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

/// The action of an [`Act::Compare`] or [`Act::Check`] once the bytes of
/// both sides are known to be equal (`same`) or not.
pub fn compared(it: &Item, same: bool) -> Act {
    if !same {
        return Act::Conflict {
            loser: Side::B,
            name: Vec::new(),
        };
    }
    if it.act == Act::Check {
        // In sync by metadata and by content.
        return Act::Record;
    }
    let (ma, mb) = (it.a.expect("both"), it.b.expect("both"));
    if ma.same_mtime(&mb) && (ma.mode == mb.mode || ma.kind == Kind::Symlink) {
        Act::Record
    } else {
        // Same bytes: the newer mtime (and its mode) wins.
        let from = if mb.mtime_ns() > ma.mtime_ns() {
            Side::B
        } else {
            Side::A
        };
        Act::Meta { from }
    }
}

/// True when something exists at a key on either side (conflict names
/// must be free on both).
pub type Taken<'a> = &'a dyn Fn(&[u8]) -> bool;

/// The side that moves aside in a conflict: the one that is not a
/// directory (a directory's content is merged, never renamed), else B.
fn loser(it: &Item) -> Side {
    match (it.a.map(|m| m.kind), it.b.map(|m| m.kind)) {
        (_, Some(Kind::Dir)) => Side::A,
        _ => Side::B,
    }
}

/// Finish the plan once comparisons are resolved (no [`Act::Compare`]
/// left): directory rules, renames, conflict names (free where `taken`
/// says so), deletion counts. `verify` checks that rename candidates hold
/// the content of their old path (see [`Verify`]).
pub fn finish(plan: &mut Plan, taken: Taken<'_>, stamp: &str, verify: Verify<'_>) {
    let items = &mut plan.items;
    for it in items.iter_mut() {
        assert!(
            !matches!(it.act, Act::Compare | Act::Check),
            "comparisons resolved before finish"
        );
        if matches!(it.act, Act::Conflict { .. }) {
            it.act = Act::Conflict {
                loser: loser(it),
                name: Vec::new(),
            };
        }
    }
    fix_dirs(items);
    renames(items, plan.sides.inodes, verify);
    name_conflicts(items, taken, stamp);
    for it in items.iter() {
        if let Act::Delete { on } = it.act {
            match it.side(on) {
                Some(m) if m.kind == Kind::Dir => plan.dir_deletes[on as usize] += 1,
                Some(_) => plan.deletes[on as usize] += 1,
                None => {}
            }
        }
    }
}

/// Directories that must stay (something inside them exists after the run)
/// are re-created instead of deleted, and win over a file.
fn fix_dirs(items: &mut [Item]) {
    let index: HashMap<Vec<u8>, usize> = items
        .iter()
        .enumerate()
        .map(|(i, it)| (it.key.clone(), i))
        .collect();
    let mut needs_dir = vec![false; items.len()];
    // Children come after their parent in key order: walk backwards, so a
    // directory is fixed once all of its descendants are.
    for i in (0..items.len()).rev() {
        if needs_dir[i] {
            let it = &mut items[i];
            match it.act.clone() {
                Act::Delete { on } => {
                    // Deleted on the other side, but something new is inside:
                    // bring the directory back there.
                    it.act = Act::Copy { from: on };
                }
                Act::Copy { from } if it.side(from).is_some_and(|m| m.kind != Kind::Dir) => {
                    // A file was to replace a directory that still has content.
                    it.act = if it.side(from.other()).is_some() {
                        Act::Conflict {
                            loser: from,
                            name: Vec::new(),
                        }
                    } else {
                        Act::Copy { from }
                    };
                }
                _ => {}
            }
        }
        if needs_dir[i] || items[i].exists_after() {
            if let Some(p) = parent_key(&items[i].key) {
                if let Some(&pi) = index.get(p) {
                    needs_dir[pi] = true;
                }
            }
        }
    }
}

/// Pair vanished paths with new ones on the same side. A pair is a rename
/// only if the bytes agree: a matching inode (with size and mtime) is not
/// proof, since a deleted file's inode is given to the next file created.
fn renames(items: &mut [Item], inodes: [bool; 2], verify: Verify<'_>) {
    // Vanished on side X (X = other side of the deletion), still unchanged
    // on the deletion side.
    let mut by_ino: HashMap<(Side, u64), usize> = HashMap::new();
    let mut by_stat: HashMap<(Side, u64, i128), Vec<usize>> = HashMap::new();
    for (i, it) in items.iter().enumerate() {
        let (Act::Delete { on }, Some(j)) = (&it.act, &it.j) else {
            continue;
        };
        let x = on.other();
        let old = j.side(x);
        if old.kind != Kind::File {
            continue;
        }
        if old.ino != 0 && inodes[x as usize] {
            by_ino.insert((x, old.ino), i);
        } else {
            by_stat
                .entry((x, old.size, old.mtime_ns()))
                .or_default()
                .push(i);
        }
    }
    if by_ino.is_empty() && by_stat.is_empty() {
        return;
    }
    let mut new_by_stat: HashMap<(Side, u64, i128), Vec<usize>> = HashMap::new();
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let Act::Copy { from: x } = it.act else {
            continue;
        };
        let Some(now) = it.side(x) else { continue };
        if now.kind != Kind::File || it.side(x.other()).is_some() {
            continue;
        }
        if now.ino != 0 && inodes[x as usize] {
            if let Some(&v) = by_ino.get(&(x, now.ino)) {
                let old = items[v].j.expect("vanished paths have a record");
                let old = old.side(x);
                if old.size == now.size && old.same_mtime(now) {
                    pairs.push((i, v));
                }
            }
        } else {
            new_by_stat
                .entry((x, now.size, now.mtime_ns()))
                .or_default()
                .push(i);
        }
    }
    for (k, news) in &new_by_stat {
        if let Some(olds) = by_stat.get(k) {
            // Only an unambiguous pair, and only if the bytes agree.
            if news.len() == 1 && olds.len() == 1 {
                pairs.push((news[0], olds[0]));
            }
        }
    }
    // Each old path pairs with one new path at most (the first, by key).
    pairs.sort_unstable();
    let mut taken = HashSet::new();
    pairs.retain(|&(_, v)| taken.insert(v));
    let cands: Vec<Candidate> = pairs
        .iter()
        .map(|&(n, v)| {
            let Act::Copy { from: x } = items[n].act else {
                unreachable!("new paths of pairs are copies")
            };
            (x, items[n].key.clone(), items[v].key.clone())
        })
        .collect();
    let ok = if cands.is_empty() {
        Vec::new()
    } else {
        verify(&cands)
    };
    for ((n, v), same) in pairs.into_iter().zip(ok) {
        let Act::Copy { from: x } = items[n].act else {
            continue;
        };
        if !same || items[v].act != (Act::Delete { on: x.other() }) {
            continue;
        }
        items[n].act = Act::Rename {
            on: x.other(),
            from: v,
        };
        items[v].act = Act::RenamedAway;
    }
}

/// Give each conflict a name no entry has on either side.
fn name_conflicts(items: &mut [Item], exists: Taken<'_>, stamp: &str) {
    let mut taken: HashSet<Vec<u8>> = HashSet::new();
    for it in items.iter_mut() {
        let Act::Conflict { loser, name } = &mut it.act else {
            continue;
        };
        let parent = parent_key(&it.key);
        for n in 1u32.. {
            let mut k = Vec::new();
            if let Some(p) = parent {
                k.extend_from_slice(p);
                k.push(0);
            }
            k.extend_from_slice(&conflict_name(name_of(&it.key), *loser, stamp, n));
            if !taken.contains(&k) && !exists(&k) {
                taken.insert(k.clone());
                *name = k;
                break;
            }
        }
    }
}

/// Longest file name (bytes) a conflict name may have: NAME_MAX of Linux
/// file systems.
pub const NAME_MAX: usize = 255;

/// `stem (conflict STAMP from X).ext`, with ` N` before the `)` from the
/// second candidate on. The extension is from the last dot that is not the
/// first byte (`.bashrc` has none). A name longer than [`NAME_MAX`] bytes
/// has its stem shortened (at a UTF-8 character boundary); an extension too
/// long to keep is taken as part of the stem.
pub fn conflict_name(name: &[u8], from: Side, stamp: &str, n: u32) -> Vec<u8> {
    let mut tag = format!(" (conflict {stamp} from {}", from.as_str()).into_bytes();
    if n > 1 {
        tag.extend_from_slice(format!(" {n}").as_bytes());
    }
    tag.push(b')');
    let dot = name.iter().rposition(|&c| c == b'.').filter(|&i| i > 0);
    let (mut stem, mut ext) = match dot {
        Some(i) => name.split_at(i),
        None => (name, &b""[..]),
    };
    // Keep at least one byte of stem beside the extension.
    if ext.len() + tag.len() + 1 > NAME_MAX {
        (stem, ext) = (name, &b""[..]);
    }
    let room = NAME_MAX.saturating_sub(tag.len() + ext.len());
    if stem.len() > room {
        stem = &stem[..utf8_floor(stem, room)];
    }
    let mut out = stem.to_vec();
    out.extend_from_slice(&tag);
    out.extend_from_slice(ext);
    out
}

/// The largest cut at or below `at` that does not split a UTF-8 character
/// (names that are not UTF-8 are cut where a continuation byte does not
/// follow).
fn utf8_floor(s: &[u8], at: usize) -> usize {
    let mut i = at.min(s.len());
    // At most 3 continuation bytes follow a character's first byte.
    for _ in 0..3 {
        if i == 0 || i == s.len() || s[i] & 0xC0 != 0x80 {
            break;
        }
        i -= 1;
    }
    i
}

/// `YYYY-MM-DD HHMM` in UTC for seconds since the epoch (clamped to the
/// years 0001 to 9999).
pub fn stamp(secs: i64) -> String {
    let secs = secs.clamp(
        jiff::Timestamp::MIN.as_second(),
        jiff::Timestamp::MAX.as_second(),
    );
    let t = jiff::Timestamp::from_second(secs).expect("clamped to the range");
    t.strftime("%Y-%m-%d %H%M").to_string()
}

/// True when `now` still is what the plan saw: the executor checks this
/// right before it replaces or deletes an entry. Where both know the
/// object's version (an S3 object's ETag and LastModified, see
/// `Store::stat`), it must be the same: a new upload of the same size
/// within the same tick of the clock is a change too.
pub fn still(now: Option<&Meta>, planned: Option<&Meta>) -> bool {
    match (now, planned) {
        (None, None) => true,
        (Some(n), Some(p)) => {
            unchanged(n, p) && (n.version == 0 || p.version == 0 || n.version == p.version)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
