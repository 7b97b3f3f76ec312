//! Plan: the merge-join of one directory's sorted source and destination
//! listings into a list of steps. Pure: no I/O, so the decision table is
//! tested on its own. The engine executes the steps.
//!
//! Decision table for an entry present on both sides (same kind):
//!
//! | kind    | compare                                   | step                    |
//! |---------|-------------------------------------------|-------------------------|
//! | file    | size differs                              | `Update`                |
//! | file    | same size, mtime differs, no `--checksum` | `Update`                |
//! | file    | same size, `--checksum`                   | `Check` (read both)     |
//! | file    | same size and mtime                       | `Same` (+ meta fix-up)  |
//! | symlink | targets unknown here                      | `CheckLink`             |
//! | dir     | -                                         | `Recurse`               |
//! | fifo, device | device number differs                | `Replace`               |
//! | fifo, device | same device number                   | `Same` (+ meta fix-up)  |
//!
//! Different kinds are `Replace` (`ReplaceBySpecial` when the source has an
//! entry that is not copied: a socket, a type ferry does not know). Destination-only entries are `Delete`
//! in sync mode and kept in copy mode; ferry's own leftover temporaries
//! (the reserved names of [`crate::store::is_temp_name`], never a user's
//! name) are always `RemoveTemp`, except partial downloads used recently:
//! they are kept for the next download of their file to resume. An entry
//! named `.ferry-versions` ([`crate::keep::VERSIONS_DIR`]) gets no step on
//! either side: it is never synced.

use crate::entry::{Kind, Listing, Meta};
use crate::keep::is_versions_dir;
use crate::store::{is_partial_name, is_temp_name, MetaChange};

/// One step of a directory's plan. Indexes point into the source (`s`) and
/// destination (`d`) listings.
#[allow(missing_docs)] // fields: `s`/`d` index the source/destination listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Source only: create (file copy, symlink, or new directory to fill).
    Create { s: usize },
    /// Both files, content differs: copy over.
    Update { s: usize, d: usize },
    /// Both files, same size, `--checksum`: compare content, then decide.
    Check { s: usize, d: usize },
    /// Same content; metadata may need the listed changes.
    Same {
        s: usize,
        d: usize,
        meta: MetaChange,
    },
    /// Both symlinks: compare targets.
    CheckLink { s: usize, d: usize },
    /// Both directories: descend.
    Recurse { s: usize, d: usize },
    /// Kinds differ: the destination entry is replaced.
    Replace { s: usize, d: usize },
    /// Destination only, sync mode: remove.
    Delete { d: usize },
    /// A leftover temporary of an interrupted run: remove.
    RemoveTemp { d: usize },
    /// Source entry of a kind that is not copied (socket, unknown type).
    Skip { s: usize },
    /// Source entry of a kind that is not copied, where the destination
    /// has a file, directory or symlink: that entry is stale (sync removes
    /// it, copy reports it).
    ReplaceBySpecial { s: usize, d: usize },
}

/// How to compare.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlanOptions {
    /// Delete destination-only entries.
    pub delete: bool,
    /// Compare file content when sizes match.
    pub checksum: bool,
    /// Compare and preserve owner and group.
    pub owner: bool,
    /// Partial downloads modified at or after this time (seconds since the
    /// epoch) are kept; older ones are removed like other temporaries.
    pub partial_cutoff: i64,
}

/// Metadata to change so that `dst` matches `src` (content aside).
pub fn meta_change(src: &Meta, dst: &Meta, owner: bool) -> MetaChange {
    MetaChange {
        mtime: !src.same_mtime(dst),
        mode: src.kind != Kind::Symlink && src.mode != dst.mode,
        owner: owner && (src.uid != dst.uid || src.gid != dst.gid),
    }
}

/// Merge-join two sorted listings into steps, appended to `out` in name order.
pub fn plan_dir(src: &Listing, dst: &Listing, opts: &PlanOptions, out: &mut Vec<Step>) {
    debug_assert!(
        src.is_sorted() && dst.is_sorted(),
        "listings must be sorted"
    );
    let (se, de) = (src.entries(), dst.entries());
    let (mut i, mut j) = (0, 0);
    while i < se.len() || j < de.len() {
        let ord = match (se.get(i), de.get(j)) {
            (Some(a), Some(b)) => src.name(a).cmp(dst.name(b)),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match ord {
            std::cmp::Ordering::Less => {
                let name = src.name(&se[i]);
                if !is_temp_name(name) && !is_versions_dir(name) {
                    out.push(if se[i].meta.kind.is_skipped() {
                        Step::Skip { s: i }
                    } else {
                        Step::Create { s: i }
                    });
                }
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                let name = dst.name(&de[j]);
                if is_versions_dir(name)
                    || is_partial_name(name) && de[j].meta.mtime_sec >= opts.partial_cutoff
                {
                    // Never synced; kept for resuming.
                } else if is_temp_name(name) {
                    out.push(Step::RemoveTemp { d: j });
                } else if opts.delete {
                    out.push(Step::Delete { d: j });
                }
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                if is_versions_dir(src.name(&se[i])) {
                    // Never synced.
                } else if is_temp_name(src.name(&se[i])) {
                    out.push(Step::RemoveTemp { d: j });
                } else {
                    out.push(compare(i, j, &se[i].meta, &de[j].meta, opts));
                }
                i += 1;
                j += 1;
            }
        }
    }
}

fn compare(s: usize, d: usize, a: &Meta, b: &Meta, opts: &PlanOptions) -> Step {
    if a.kind.is_skipped() {
        return if b.kind.is_skipped() {
            Step::Skip { s }
        } else {
            Step::ReplaceBySpecial { s, d }
        };
    }
    if a.kind != b.kind {
        return Step::Replace { s, d };
    }
    match a.kind {
        Kind::Dir => Step::Recurse { s, d },
        Kind::Symlink => Step::CheckLink { s, d },
        k if k.is_node() && a.rdev != b.rdev => Step::Replace { s, d },
        k if k.is_node() => Step::Same {
            s,
            d,
            meta: meta_change(a, b, opts.owner),
        },
        _ if a.size != b.size => Step::Update { s, d },
        _ if opts.checksum => Step::Check { s, d },
        _ if !a.same_mtime(b) => Step::Update { s, d },
        _ => Step::Same {
            s,
            d,
            meta: meta_change(a, b, opts.owner),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(kind: Kind, size: u64, mtime: i64) -> Meta {
        Meta {
            kind,
            size,
            mtime_sec: mtime,
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

    fn listing(items: &[(&str, Meta)]) -> Listing {
        let mut l = Listing::new();
        for (n, meta) in items {
            l.push(n.as_bytes(), *meta);
        }
        l.sort();
        l
    }

    fn plan(s: &Listing, d: &Listing, delete: bool, checksum: bool) -> Vec<Step> {
        let mut out = Vec::new();
        plan_dir(
            s,
            d,
            &PlanOptions {
                delete,
                checksum,
                owner: false,
                partial_cutoff: 0,
            },
            &mut out,
        );
        out
    }

    #[test]
    fn decision_table() {
        let f = |sz, t| m(Kind::File, sz, t);
        let s = listing(&[
            ("a", f(1, 1)),
            ("b", f(2, 1)),
            ("c", f(1, 1)),
            ("d", f(1, 2)),
            ("e", m(Kind::Dir, 0, 1)),
            ("f", m(Kind::Symlink, 3, 1)),
            ("g", m(Kind::Dir, 0, 1)),
            ("h", m(Kind::Other, 0, 1)),
        ]);
        let d = listing(&[
            (".ferry-tmp-0000000100000002.~ferry~", f(9, 9)),
            ("b", f(3, 1)),
            ("c", f(1, 1)),
            ("d", f(1, 1)),
            ("e", m(Kind::Dir, 0, 5)),
            ("f", m(Kind::Symlink, 3, 1)),
            ("g", f(1, 1)),
            ("z", f(1, 1)),
        ]);
        assert_eq!(
            plan(&s, &d, true, false),
            vec![
                Step::RemoveTemp { d: 0 },
                Step::Create { s: 0 },
                Step::Update { s: 1, d: 1 },
                Step::Same {
                    s: 2,
                    d: 2,
                    meta: MetaChange::default()
                },
                Step::Update { s: 3, d: 3 },
                Step::Recurse { s: 4, d: 4 },
                Step::CheckLink { s: 5, d: 5 },
                Step::Replace { s: 6, d: 6 },
                Step::Skip { s: 7 },
                Step::Delete { d: 7 },
            ]
        );
        // Copy mode keeps z; checksum mode checks same-size files.
        let p = plan(&s, &d, false, true);
        assert!(!p.contains(&Step::Delete { d: 7 }));
        assert!(p.contains(&Step::Check { s: 2, d: 2 }));
        assert!(p.contains(&Step::Check { s: 3, d: 3 }));
    }

    #[test]
    fn user_names_like_old_temporaries_are_synced_and_special_files_replace() {
        let f = |sz, t| m(Kind::File, sz, t);
        let s = listing(&[
            (".ferry-tmp.a", f(1, 1)),
            ("fifo", m(Kind::Other, 0, 1)),
            ("fifo2", m(Kind::Other, 0, 1)),
        ]);
        let d = listing(&[
            (".ferry-tmp.a", f(2, 1)),
            (".ferry-tmp.part.0123456789abcdef", f(2, 1)),
            ("fifo", f(1, 1)),
            ("fifo2", m(Kind::Other, 0, 1)),
        ]);
        assert_eq!(
            plan(&s, &d, true, false),
            vec![
                Step::Update { s: 0, d: 0 },
                Step::Delete { d: 1 },
                Step::ReplaceBySpecial { s: 1, d: 2 },
                Step::Skip { s: 2 },
            ]
        );
        // Copy never deletes a user's file, whatever its name.
        assert_eq!(
            plan(&s, &d, false, false),
            vec![
                Step::Update { s: 0, d: 0 },
                Step::ReplaceBySpecial { s: 1, d: 2 },
                Step::Skip { s: 2 },
            ]
        );
    }

    #[test]
    fn nodes_are_created_compared_by_type_and_device_and_sockets_skipped() {
        let node = |kind, rdev| Meta {
            rdev,
            ..m(kind, 0, 1)
        };
        let s = listing(&[
            ("a", node(Kind::Fifo, 0)),
            ("b", node(Kind::CharDev, 0x103)),
            ("c", node(Kind::CharDev, 0x103)),
            ("d", node(Kind::BlockDev, 0x700)),
            ("e", node(Kind::Fifo, 0)),
            ("f", m(Kind::File, 1, 1)),
            ("g", node(Kind::Socket, 0)),
            ("h", node(Kind::Socket, 0)),
        ]);
        let d = listing(&[
            ("b", node(Kind::CharDev, 0x103)),
            ("c", node(Kind::CharDev, 0x105)),
            ("d", node(Kind::CharDev, 0x700)),
            ("e", m(Kind::File, 1, 1)),
            ("f", node(Kind::Fifo, 0)),
            ("h", node(Kind::Fifo, 0)),
        ]);
        assert_eq!(
            plan(&s, &d, true, false),
            vec![
                Step::Create { s: 0 },
                Step::Same {
                    s: 1,
                    d: 0,
                    meta: MetaChange::default()
                },
                Step::Replace { s: 2, d: 1 },
                Step::Replace { s: 3, d: 2 },
                Step::Replace { s: 4, d: 3 },
                Step::Replace { s: 5, d: 4 },
                Step::Skip { s: 6 },
                Step::ReplaceBySpecial { s: 7, d: 5 },
            ]
        );
    }

    #[test]
    fn mode_difference_is_metadata_only() {
        let mut a = m(Kind::File, 1, 1);
        a.mode = 0o600;
        let s = listing(&[("x", a)]);
        let d = listing(&[("x", m(Kind::File, 1, 1))]);
        assert_eq!(
            plan(&s, &d, true, false),
            vec![Step::Same {
                s: 0,
                d: 0,
                meta: MetaChange {
                    mtime: false,
                    mode: true,
                    owner: false
                }
            }]
        );
    }

    #[test]
    fn recent_partial_downloads_are_kept_old_ones_removed() {
        let f = |sz, t| m(Kind::File, sz, t);
        let s = listing(&[("a", f(1, 1))]);
        let d = listing(&[
            (".ferry-part-00000000000000aa.~ferry~", f(5, 100)),
            (".ferry-part-00000000000000bb.~ferry~", f(5, 300)),
            ("a", f(1, 1)),
        ]);
        let opts = PlanOptions {
            delete: true,
            partial_cutoff: 200,
            ..PlanOptions::default()
        };
        let mut out = Vec::new();
        plan_dir(&s, &d, &opts, &mut out);
        assert_eq!(
            out,
            vec![
                Step::RemoveTemp { d: 0 },
                Step::Same {
                    s: 0,
                    d: 2,
                    meta: MetaChange::default()
                },
            ]
        );
    }
}
