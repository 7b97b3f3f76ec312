//! Extended attributes (`-X`) and POSIX ACLs (`-A`): which ones a run keeps
//! ([`XattrSel`]), one entry's attributes ([`Xattrs`]), and the run's shared
//! state ([`XattrRun`]).
//!
//! Attributes are names (bytes, as the kernel lists them: `user.x`,
//! `security.capability`, `system.posix_acl_access`) with binary values.
//! ACLs travel as the raw values of `system.posix_acl_access` and
//! `system.posix_acl_default`, so an ACL is kept exactly, entry for entry.
//! A store says which it keeps ([`crate::store::XattrStore::caps`]); the engine
//! keeps what the run asks for and both stores keep, and costs nothing when
//! nothing is asked.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which attributes a run keeps, or a store can keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XattrSel {
    /// Extended attributes (`-X`): `user.*`, and as root `trusted.*` and
    /// `security.*`; never `system.*`.
    pub xattrs: bool,
    /// POSIX ACLs (`-A`): access ACLs, and default ACLs of directories.
    pub acls: bool,
}

impl XattrSel {
    /// Nothing.
    pub const NONE: XattrSel = XattrSel {
        xattrs: false,
        acls: false,
    };
    /// Everything.
    pub const ALL: XattrSel = XattrSel {
        xattrs: true,
        acls: true,
    };

    /// True when anything is kept.
    pub fn any(self) -> bool {
        self.xattrs || self.acls
    }

    /// What both keep.
    pub fn and(self, other: XattrSel) -> XattrSel {
        XattrSel {
            xattrs: self.xattrs && other.xattrs,
            acls: self.acls && other.acls,
        }
    }

    /// What `self` asks for that `kept` does not keep.
    pub fn lacking(self, kept: XattrSel) -> XattrSel {
        XattrSel {
            xattrs: self.xattrs && !kept.xattrs,
            acls: self.acls && !kept.acls,
        }
    }

    /// The flags and words naming the selection in messages:
    /// `"-X (extended attributes)"`, `"-A (ACLs)"`, or both.
    pub fn describe(self) -> String {
        match (self.xattrs, self.acls) {
            (true, true) => "-X/-A (extended attributes and ACLs)".into(),
            (true, false) => "-X (extended attributes)".into(),
            (false, true) => "-A (ACLs)".into(),
            (false, false) => String::new(),
        }
    }
}

/// One attribute: its name and value.
type Pair = (Box<[u8]>, Box<[u8]>);

/// One entry's attributes: names with their values, sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Xattrs {
    list: Vec<Pair>,
}

impl Xattrs {
    /// None.
    pub fn new() -> Xattrs {
        Xattrs::default()
    }

    /// Forget all attributes.
    pub fn clear(&mut self) {
        self.list.clear();
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Add an attribute (call [`Xattrs::sort`] once all are in).
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        self.list.push((name.into(), value.into()));
    }

    /// Order by name (a store lists them in its own order).
    pub fn sort(&mut self) {
        self.list.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    }

    /// The value of `name`.
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.list
            .binary_search_by(|(n, _)| n.as_ref().cmp(name))
            .ok()
            .map(|i| &*self.list[i].1)
    }

    /// Names and values, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.list.iter().map(|(n, v)| (&**n, &**v))
    }

    /// What turns `have` into `self`: the names to remove (in `have`, not
    /// in `self`) and the attributes to set (new, or with another value).
    #[allow(clippy::type_complexity)]
    pub fn diff<'a>(&'a self, have: &'a Xattrs) -> (Vec<&'a [u8]>, Vec<(&'a [u8], &'a [u8])>) {
        let (mut remove, mut set) = (Vec::new(), Vec::new());
        let (mut i, mut j) = (0, 0);
        let (w, h) = (&self.list, &have.list);
        while i < w.len() || j < h.len() {
            let ord = match (w.get(i), h.get(j)) {
                (Some(a), Some(b)) => a.0.cmp(&b.0),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match ord {
                std::cmp::Ordering::Less => {
                    set.push((&*w[i].0, &*w[i].1));
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    remove.push(&*h[j].0);
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    if w[i].1 != h[j].1 {
                        set.push((&*w[i].0, &*w[i].1));
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        (remove, set)
    }
}

/// A run's attribute keeping: what it keeps, and the entries whose
/// destination could not keep them (a filesystem without extended
/// attributes), said once at the end instead of an error per entry.
#[derive(Debug, Default)]
pub struct XattrRun {
    /// What the run keeps: what was asked and both stores keep.
    pub sel: XattrSel,
    unsupported: AtomicU64,
}

impl XattrRun {
    /// Keep `asked` where both stores keep it (`src`, `dst`: their
    /// [`crate::store::XattrStore::caps`]).
    pub fn new(asked: XattrSel, src: XattrSel, dst: XattrSel) -> XattrRun {
        XattrRun {
            sel: asked.and(src).and(dst),
            unsupported: AtomicU64::new(0),
        }
    }

    /// The run itself, when it keeps anything (`None` costs nothing).
    pub fn active(&self) -> Option<&XattrRun> {
        self.sel.any().then_some(self)
    }

    /// The outcome of writing one entry's attributes: an error the
    /// destination gives because it keeps no attributes at all is counted
    /// (for [`XattrRun::note`]), not returned.
    pub fn settle(&self, res: io::Result<()>) -> io::Result<()> {
        match res {
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                self.unsupported.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            r => r,
        }
    }

    /// The one line for the end of the run when a destination could not
    /// keep the attributes of some entries (`dst` names it).
    pub fn note(&self, dst: &str) -> Option<String> {
        let n = self.unsupported.load(Ordering::Relaxed);
        (n > 0).then(|| {
            format!(
                "{dst} does not support extended attributes (the filesystem refused them): {n} {} left without their {}",
                if n == 1 { "entry" } else { "entries" },
                match (self.sel.xattrs, self.sel.acls) {
                    (true, true) => "extended attributes and ACLs",
                    (true, false) => "extended attributes",
                    _ => "ACLs",
                }
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(pairs: &[(Vec<u8>, Vec<u8>)]) -> Xattrs {
        let mut x = Xattrs::new();
        for (n, v) in pairs {
            x.push(n, v);
        }
        x.sort();
        x
    }

    proptest! {
        /// Applying the diff to `have` gives `want`, and only what differs is touched.
        #[test]
        fn diff_turns_have_into_want(
            want in prop::collection::btree_map(prop::collection::vec(0u8..4, 1..3), prop::collection::vec(0u8..3, 0..3), 0..8),
            have in prop::collection::btree_map(prop::collection::vec(0u8..4, 1..3), prop::collection::vec(0u8..3, 0..3), 0..8),
        ) {
            let w = set(&want.clone().into_iter().collect::<Vec<_>>());
            let h = set(&have.clone().into_iter().collect::<Vec<_>>());
            let (remove, put) = w.diff(&h);
            let mut got = have.clone();
            for n in &remove {
                prop_assert!(!want.contains_key(*n));
                got.remove(*n);
            }
            for (n, v) in &put {
                prop_assert_ne!(have.get(*n).map(Vec::as_slice), Some(*v));
                got.insert(n.to_vec(), v.to_vec());
            }
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(remove.is_empty() && put.is_empty(), w == h);
        }
    }

    #[test]
    fn get_finds_by_name_and_unsupported_is_counted_once_per_entry() {
        let x = set(&[
            (b"user.b".to_vec(), b"2".to_vec()),
            (b"user.a".to_vec(), b"\0".to_vec()),
        ]);
        assert_eq!(x.get(b"user.a"), Some(&b"\0"[..]));
        assert_eq!(x.get(b"user.c"), None);
        let run = XattrRun::new(
            XattrSel::ALL,
            XattrSel::ALL,
            XattrSel {
                xattrs: true,
                acls: false,
            },
        );
        assert_eq!(
            run.sel,
            XattrSel {
                xattrs: true,
                acls: false
            }
        );
        assert!(run.note("DST").is_none());
        assert!(run.settle(Err(io::ErrorKind::Unsupported.into())).is_ok());
        assert!(run
            .settle(Err(io::ErrorKind::PermissionDenied.into()))
            .is_err());
        let note = run.note("DST /x").unwrap();
        assert!(
            note.contains("1 entry left without their extended attributes"),
            "{note}"
        );
        assert!(XattrRun::new(XattrSel::NONE, XattrSel::ALL, XattrSel::ALL)
            .active()
            .is_none());
    }
}
