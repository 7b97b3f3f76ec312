//! The rules of two-way sync for one path, as a pure function: what the
//! journal remembers of it (the state of each side at the last sync) and
//! what each side holds now → one [`Decision`].
//!
//! The one safety rule everything else follows from: a side's entry may be
//! replaced or deleted only when it is *unchanged* since the last sync
//! (equal to the journal's record of that side). Whenever both sides
//! changed, or there is no record to tell, both versions are kept
//! ([`Decision::Compare`] first finds out whether they are equal).

use ferry_engine::{Kind, Meta};

/// One of the two replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The first root given.
    A,
    /// The second root given.
    B,
}

impl Side {
    /// The other side.
    pub fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    /// `"A"` or `"B"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }
}

/// The journal's record of one path: each side's metadata right after the
/// last sync that touched it (same content, but each side has its own inode,
/// and an object store its own view of the mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Synced {
    /// Side A's entry.
    pub a: Meta,
    /// Side B's entry.
    pub b: Meta,
}

impl Synced {
    /// The record of one side.
    pub fn side(&self, s: Side) -> &Meta {
        match s {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }
}

/// What to do with one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// In sync, and the journal says so: nothing to do.
    Keep,
    /// Both sides hold the same thing but the journal does not know it yet.
    Record,
    /// Gone on both sides: drop the journal's record.
    Forget,
    /// Both sides hold an entry and nothing tells whether they are equal:
    /// compare the contents (equal → record, else a conflict).
    Compare,
    /// Copy `from`'s entry over the other side's (which is absent or
    /// unchanged since the last sync). For a directory: create it.
    Copy {
        /// The side whose entry wins.
        from: Side,
    },
    /// Only the permission bits changed on `from`: set them on the other side.
    Meta {
        /// The side whose mode wins.
        from: Side,
    },
    /// Delete `on`'s entry (unchanged since the last sync; the other side
    /// deleted it).
    Delete {
        /// The side to delete on.
        on: Side,
    },
    /// Both sides changed the path differently: keep both versions.
    Conflict,
}

/// True when an entry is what the journal recorded for its side: same kind,
/// and for non-directories same size, mtime (ns), mode, inode and change
/// time (where the store has them: an edit in place that keeps the size and
/// puts the mtime back still moves the ctime; not for a file with several
/// names, whose ctime any act on another name moves). A directory's own
/// metadata is not compared: its content is, entry by entry.
pub fn unchanged(now: &Meta, then: &Meta) -> bool {
    if now.kind != then.kind {
        return false;
    }
    if now.kind == Kind::Dir {
        return true;
    }
    now.size == then.size
        && now.same_mtime(then)
        && now.mode == then.mode
        && (now.ino == 0 || then.ino == 0 || now.ino == then.ino)
        && (now.ctime == 0 || then.ctime == 0 || now.nlink > 1 || now.ctime == then.ctime)
}

/// True when only the permission bits differ (same file, same content).
fn mode_only(now: &Meta, then: &Meta) -> bool {
    now.kind == Kind::File
        && then.kind == Kind::File
        && now.size == then.size
        && now.same_mtime(then)
        && (now.ino == 0 || then.ino == 0 || now.ino == then.ino)
        && now.mode != then.mode
}

/// Decide one path. `j`: the journal's record (`None`: never synced, or no
/// journal); `a`, `b`: what each side holds now.
pub fn reconcile(j: Option<&Synced>, a: Option<&Meta>, b: Option<&Meta>) -> Decision {
    let Some(j) = j else {
        return match (a, b) {
            (None, None) => Decision::Keep,
            (Some(_), None) => Decision::Copy { from: Side::A },
            (None, Some(_)) => Decision::Copy { from: Side::B },
            (Some(a), Some(b)) => both_present(a, b),
        };
    };
    match (a, b) {
        (None, None) => Decision::Forget,
        (Some(a), None) => {
            if unchanged(a, &j.a) {
                Decision::Delete { on: Side::A }
            } else {
                // Deleted on B, modified on A: the modification wins.
                Decision::Copy { from: Side::A }
            }
        }
        (None, Some(b)) => {
            if unchanged(b, &j.b) {
                Decision::Delete { on: Side::B }
            } else {
                Decision::Copy { from: Side::B }
            }
        }
        (Some(a), Some(b)) => match (unchanged(a, &j.a), unchanged(b, &j.b)) {
            (true, true) => Decision::Keep,
            (false, true) if mode_only(a, &j.a) && b.kind == Kind::File => {
                Decision::Meta { from: Side::A }
            }
            (false, true) => Decision::Copy { from: Side::A },
            (true, false) if mode_only(b, &j.b) && a.kind == Kind::File => {
                Decision::Meta { from: Side::B }
            }
            (true, false) => Decision::Copy { from: Side::B },
            (false, false) => both_present(a, b),
        },
    }
}

/// Both sides hold an entry and neither can be trusted to be the old one.
fn both_present(a: &Meta, b: &Meta) -> Decision {
    match (a.kind, b.kind) {
        (Kind::Dir, Kind::Dir) => Decision::Record,
        (x, y) if x != y => Decision::Conflict,
        (Kind::File, _) if a.size != b.size => Decision::Conflict,
        // Same size files, or two symlinks: only their bytes can tell.
        _ => Decision::Compare,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use Decision::{Compare, Conflict, Copy, Delete, Forget, Keep, Record};
    use Side::*;

    fn file(size: u64, mtime: i64, ino: u64) -> Meta {
        Meta {
            kind: Kind::File,
            size,
            mtime_sec: mtime,
            mtime_nsec: 0,
            mode: 0o644,
            uid: 0,
            gid: 0,
            ino,
            version: 0,
            rdev: 0,
            sparse: false,
            nlink: 0,
            dev: 0,
            ctime: 0,
        }
    }

    fn dir(ino: u64) -> Meta {
        Meta {
            kind: Kind::Dir,
            ..file(0, 0, ino)
        }
    }

    fn rec(a: Meta, b: Meta) -> Synced {
        Synced { a, b }
    }

    #[test]
    fn table() {
        let fa = file(10, 100, 1);
        let fb = file(10, 100, 2);
        let j = rec(fa, fb);
        let a2 = file(11, 200, 1);
        let b2 = file(12, 300, 2);
        type Case = (Option<Synced>, Option<Meta>, Option<Meta>, Decision);
        let cases: Vec<Case> = vec![
            // First sight (no journal).
            (None, Some(fa), None, Copy { from: A }),
            (None, None, Some(fb), Copy { from: B }),
            (None, Some(fa), Some(fb), Compare),
            (None, Some(fa), Some(b2), Conflict),
            (None, Some(dir(1)), Some(dir(2)), Record),
            (None, Some(dir(1)), Some(fb), Conflict),
            (None, None, None, Keep),
            // Unchanged.
            (Some(j), Some(fa), Some(fb), Keep),
            // One side changed.
            (Some(j), Some(a2), Some(fb), Copy { from: A }),
            (Some(j), Some(fa), Some(b2), Copy { from: B }),
            // Deleted on one side, unchanged on the other.
            (Some(j), None, Some(fb), Delete { on: B }),
            (Some(j), Some(fa), None, Delete { on: A }),
            // Deleted on one side, modified on the other: modification wins.
            (Some(j), None, Some(b2), Copy { from: B }),
            (Some(j), Some(a2), None, Copy { from: A }),
            // Both gone.
            (Some(j), None, None, Forget),
            // Both changed.
            (Some(j), Some(a2), Some(b2), Conflict),
            (Some(j), Some(a2), Some(file(11, 999, 2)), Compare),
            // Type change on one side.
            (Some(j), Some(dir(1)), Some(fb), Copy { from: A }),
            (Some(j), Some(dir(1)), Some(b2), Conflict),
            // Mode only.
            (
                Some(j),
                Some(Meta { mode: 0o600, ..fa }),
                Some(fb),
                Decision::Meta { from: A },
            ),
            // Replaced by another inode with the same size and mtime.
            (Some(j), Some(file(10, 100, 9)), Some(fb), Copy { from: A }),
            // Directories.
            (Some(rec(dir(1), dir(2))), Some(dir(5)), Some(dir(6)), Keep),
            (
                Some(rec(dir(1), dir(2))),
                None,
                Some(dir(2)),
                Delete { on: B },
            ),
        ];
        for (j, a, b, want) in cases {
            assert_eq!(
                reconcile(j.as_ref(), a.as_ref(), b.as_ref()),
                want,
                "j={j:?} a={a:?} b={b:?}"
            );
        }
    }

    /// An edit in place that keeps the size and puts the mtime back (a
    /// tool restoring timestamps) is still a change: its ctime moved. The
    /// other side's change then meets it as a conflict (compared), never
    /// copied over it; alone, it is copied to the other side.
    #[test]
    fn an_edit_that_restores_size_and_mtime_is_a_change() {
        let then = Meta {
            ctime: 1 << 63 | 100,
            ..file(5, 1, 7)
        };
        let edited = Meta {
            ctime: 1 << 63 | 200,
            ..then
        };
        let j = rec(then, Meta { ino: 8, ..then });
        let b_then = j.b;
        let b_edited = Meta {
            ctime: 1 << 63 | 300,
            ..b_then
        };
        assert_eq!(
            reconcile(Some(&j), Some(&edited), Some(&b_then)),
            Copy { from: A }
        );
        assert_eq!(
            reconcile(Some(&j), Some(&then), Some(&b_edited)),
            Copy { from: B }
        );
        let a_new = Meta {
            mtime_sec: 9,
            ..then
        };
        assert_eq!(reconcile(Some(&j), Some(&a_new), Some(&b_edited)), Compare);
        assert_eq!(reconcile(Some(&j), Some(&then), Some(&b_then)), Keep);
        // A store without change times (0) is compared as before.
        let no_ctime = Meta { ctime: 0, ..edited };
        assert_eq!(reconcile(Some(&j), Some(&no_ctime), Some(&b_then)), Keep);
    }

    fn any_meta() -> impl Strategy<Value = Option<Meta>> {
        prop_oneof![
            Just(None),
            (0u64..3, 0i64..3, 0u64..3, 0u64..3).prop_map(|(s, m, i, c)| Some(Meta {
                ctime: if c == 0 { 0 } else { 1 << 63 | c },
                ..file(s, m, i)
            })),
            (0u64..3).prop_map(|i| Some(dir(i))),
            (0u64..2).prop_map(|s| Some(Meta {
                kind: Kind::Symlink,
                ..file(s, 0, 0)
            })),
        ]
    }

    proptest! {
        /// Whatever the states: an entry is only ever deleted or replaced
        /// when it is unchanged since the last sync (or absent), and a
        /// change is never dropped silently.
        #[test]
        fn never_touches_a_change(ja in any_meta(), jb in any_meta(), a in any_meta(), b in any_meta()) {
            let j = match (ja, jb) {
                (Some(x), Some(y)) if x.kind == y.kind => Some(rec(x, y)),
                _ => None,
            };
            let d = reconcile(j.as_ref(), a.as_ref(), b.as_ref());
            let unchanged_or_absent = |s: Side| {
                let now = match s { A => a, B => b };
                match (now, j) {
                    (None, _) => true,
                    (Some(n), Some(j)) => unchanged(&n, j.side(s)),
                    (Some(_), None) => false,
                }
            };
            match d {
                Copy { from } => {
                    prop_assert!(unchanged_or_absent(from.other()));
                    let src = match from { A => a, B => b };
                    prop_assert!(src.is_some());
                }
                Delete { on } => {
                    let now = match on { A => a, B => b };
                    prop_assert!(now.is_some() && unchanged_or_absent(on));
                    let other = match on { A => b, B => a };
                    prop_assert!(other.is_none());
                }
                Decision::Meta { from } => prop_assert!(unchanged_or_absent(from.other())),
                Keep => {
                    // Nothing to do only when nothing changed.
                    prop_assert!(a.is_none() && b.is_none() && j.is_none()
                        || (unchanged_or_absent(A) && unchanged_or_absent(B) && a.is_some() && b.is_some()));
                }
                Forget => prop_assert!(a.is_none() && b.is_none()),
                Record | Compare | Conflict => prop_assert!(a.is_some() && b.is_some()),
            }
        }
    }
}
