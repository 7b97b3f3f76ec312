//! Hard links (`-H`): the names of one source file are names of one file in
//! the destination.
//!
//! Source files are told apart by device and inode ([`Meta::dev`],
//! [`Meta::ino`], from the listing's `statx`). A file with more than one
//! name (`nlink > 1`) is a *group*: the first of its names the walk meets is
//! its leader, transferred like any file (copied, or kept when the
//! destination has it already); every other name is then made a hard link
//! to the leader's destination name, never copied. The walk visits
//! directories in parallel, so a name met while its leader is still being
//! copied waits in the group (holding one count of its directory's pending
//! work, so the directory's metadata is set after the link) and is linked
//! by the worker that commits the leader. Only files with several names
//! enter the map; a group leaves it once all its names were met.
//!
//! Across runs the destination must not keep links the source no longer
//! has: a destination file with several names that the run keeps as it is
//! stands for one source file (`owners`); a second source file whose
//! destination name is that same file gets a file of its own. A group whose
//! leader is kept and whose other names are already its names costs nothing.
//!
//! Without `-H` none of this runs; with `-H`, files with one name on both
//! sides take the usual path (no lock, no syscall more).

use parking_lot::Mutex;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use super::{Engine, FileBatch, Node};
use crate::entry::{join, Kind, Meta};
use crate::report::Stats;
use crate::store::{MetaChange, Store, StoreExt};

/// How the transfer of one file ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Written (or, in a dry run, would be).
    Copied,
    /// The destination's file has the same content and was kept.
    Same,
    /// Not transferred (reported).
    Failed,
}

/// A file's identity: device and inode.
type Id = (u64, u64);

fn id(m: &Meta) -> Id {
    (m.dev, m.ino)
}

/// Where a group's leader is in the destination: its directory (while the
/// walk holds it open; else reopened by its path) and name.
struct Place<S: Store, D: Store> {
    node: Weak<Node<S, D>>,
    dir: Vec<u8>,
    name: CString,
}

impl<S: Store, D: Store> Place<S, D> {
    fn of(node: &Arc<Node<S, D>>, name: &CStr) -> Self {
        Place {
            node: Arc::downgrade(node),
            dir: node.rel.clone(),
            name: name.to_owned(),
        }
    }

    fn path(&self) -> Vec<u8> {
        join(&self.dir, self.name.to_bytes())
    }
}

impl<S: Store, D: Store> Clone for Place<S, D> {
    fn clone(&self) -> Self {
        Place {
            node: self.node.clone(),
            dir: self.dir.clone(),
            name: self.name.clone(),
        }
    }
}

/// A group's leader once it is done: where it is, and its destination
/// file when it was kept as it was.
struct Led<'x, S: Store, D: Store> {
    leader: &'x Place<S, D>,
    kept: Option<Id>,
}

/// A name of a group waiting for its leader.
struct Waiter<S: Store, D: Store> {
    node: Arc<Node<S, D>>,
    name: CString,
    meta: Meta,
    dst: Option<Meta>,
}

enum State<S: Store, D: Store> {
    /// The leader is being transferred; these names wait for it.
    Pending(Vec<Waiter<S, D>>),
    /// The leader is in place. `kept`: the identity of the destination
    /// file when it was kept as it was (names already of that file are done).
    Done { kept: Option<Id> },
}

struct Group<S: Store, D: Store> {
    leader: Place<S, D>,
    state: State<S, D>,
    /// Names met so far: the group is forgotten once all were.
    seen: u32,
}

/// The hard-link state of one run.
pub(super) struct Links<S: Store, D: Store> {
    /// Both stores keep hard links; else `-H` only says once that the
    /// destination cannot, and every name is copied as a file.
    enabled: bool,
    /// The note that the destination cannot store hard links was made.
    noted: AtomicBool,
    /// The note that a name could not be linked (and was copied) was made.
    unlinkable: AtomicBool,
    groups: Mutex<HashMap<Id, Group<S, D>>>,
    /// Destination files with several names, kept as they are: the source
    /// file each stands for.
    owners: Mutex<HashMap<Id, Id>>,
}

impl<S: Store, D: Store> Links<S, D> {
    pub(super) fn new(enabled: bool) -> Self {
        Links {
            enabled,
            noted: AtomicBool::new(false),
            unlinkable: AtomicBool::new(false),
            groups: Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// May the destination file `dm` stay as it is for source file `sm`?
    /// Not when it has other names and one of them was kept for another
    /// source file.
    fn claim(&self, dm: &Meta, sm: &Meta) -> bool {
        if dm.kind != Kind::File || dm.nlink <= 1 {
            return true;
        }
        let mut owners = self.owners.lock();
        *owners.entry(id(dm)).or_insert(id(sm)) == id(sm)
    }
}

/// Errors after which a name is copied as a file rather than linked: the
/// destination cannot link here (another filesystem below DST, a
/// filesystem without hard links, too many links to one file).
fn cannot_link(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Unsupported
            | io::ErrorKind::CrossesDevices
            | io::ErrorKind::TooManyLinks
            | io::ErrorKind::PermissionDenied
    )
}

/// How a file reached the links: to transfer (`check`: compare content
/// first) or found the same on both sides (with these metadata changes).
#[derive(Clone, Copy)]
pub(super) enum How {
    Transfer { check: bool },
    Same(MetaChange),
}

impl<S: Store, D: Store> Engine<'_, S, D> {
    /// A file of SRC under `-H` (see `Engine::add_file`, `Engine::same`):
    /// transferred, kept, linked to its group's leader, or waiting for it.
    pub(super) fn group_file(
        &self,
        l: &Links<S, D>,
        node: &Arc<Node<S, D>>,
        batch: &mut FileBatch,
        name: &CStr,
        (sm, dm): (Meta, Option<Meta>),
        how: How,
    ) {
        // May the destination's file stay (if its content is the same)?
        let keepable = |l: &Links<S, D>| match (how, dm) {
            (How::Transfer { check: false }, _) | (_, None) => false,
            (_, Some(d)) => l.claim(&d, &sm),
        };
        if !l.enabled || sm.nlink <= 1 {
            if !l.enabled && sm.nlink > 1 && !l.noted.swap(true, Ordering::Relaxed) {
                self.rep.note(
                    "-H: the destination cannot store hard links: each name of a file with several is copied as a file of its own",
                );
            }
            let keep = !l.enabled || keepable(l);
            return match how {
                How::Same(meta) if keep => self.same(node, name, &sm, meta),
                How::Same(_) => batch.add(name.to_bytes(), sm, dm, false),
                How::Transfer { check } => batch.add(name.to_bytes(), sm, dm, check && keep),
            };
        }
        let mut groups = l.groups.lock();
        let g = match groups.entry(id(&sm)) {
            Entry::Vacant(v) => {
                // The leader: transferred (or kept) like any file.
                let keep = keepable(l);
                let kept = match (how, keep) {
                    (How::Same(_), true) => dm.map(|d| id(&d)),
                    _ => None,
                };
                v.insert(Group {
                    leader: Place::of(node, name),
                    state: match kept {
                        Some(k) => State::Done { kept: Some(k) },
                        None => State::Pending(Vec::new()),
                    },
                    seen: 1,
                });
                drop(groups);
                return match (how, kept) {
                    (How::Same(meta), Some(_)) => self.same(node, name, &sm, meta),
                    (How::Same(_), None) => batch.add(name.to_bytes(), sm, dm, false),
                    (How::Transfer { check }, _) => {
                        batch.add(name.to_bytes(), sm, dm, check && keep)
                    }
                };
            }
            Entry::Occupied(o) => o.into_mut(),
        };
        g.seen += 1;
        match &mut g.state {
            State::Pending(waiters) => {
                node.pending.fetch_add(1, Ordering::AcqRel);
                waiters.push(Waiter {
                    node: node.clone(),
                    name: name.to_owned(),
                    meta: sm,
                    dst: dm,
                });
            }
            State::Done { kept } => {
                let (kept, leader) = (*kept, g.leader.clone());
                if g.seen >= sm.nlink {
                    groups.remove(&id(&sm));
                }
                drop(groups);
                let led = Led {
                    leader: &leader,
                    kept,
                };
                self.member(l, node, name, &sm, dm, led);
            }
        }
    }

    /// The leader `name` of its group was transferred (`out`): its waiting
    /// names are linked to it, or, when it failed, the first of them takes
    /// its place.
    pub(super) fn led(
        &self,
        l: &Links<S, D>,
        node: &Arc<Node<S, D>>,
        name: &CStr,
        sm: &Meta,
        dm: Option<Meta>,
        out: Outcome,
    ) {
        if !l.enabled {
            return;
        }
        let mut groups = l.groups.lock();
        let Some(g) = groups.get_mut(&id(sm)) else {
            return;
        };
        let is_leader = std::ptr::eq(g.leader.node.as_ptr(), Arc::as_ptr(node))
            && g.leader.name.as_c_str() == name;
        let State::Pending(waiters) = &mut g.state else {
            return;
        };
        if !is_leader {
            return;
        }
        if out == Outcome::Failed {
            if waiters.is_empty() {
                // The next name met leads instead.
                groups.remove(&id(sm));
                return;
            }
            let w = waiters.remove(0);
            g.leader = Place::of(&w.node, &w.name);
            drop(groups);
            let out = self.transfer(&w.node, &w.name, &w.meta, w.dst, false);
            self.led(l, &w.node, &w.name, &w.meta, w.dst, out);
            self.done(&w.node);
            return;
        }
        let kept = match (out, dm) {
            (Outcome::Same, Some(d)) => Some(id(&d)),
            _ => None,
        };
        let waiters = match std::mem::replace(&mut g.state, State::Done { kept }) {
            State::Pending(w) => w,
            State::Done { .. } => Vec::new(),
        };
        let leader = g.leader.clone();
        if g.seen >= sm.nlink {
            groups.remove(&id(sm));
        }
        drop(groups);
        for w in waiters {
            let led = Led {
                leader: &leader,
                kept,
            };
            self.member(l, &w.node, &w.name, &w.meta, w.dst, led);
            self.done(&w.node);
        }
    }

    /// Make `name` (source `sm`, destination `dm`) a name of its group's
    /// leader, unless it is one already (`led.kept`: the leader's
    /// destination file, when kept as it was).
    fn member(
        &self,
        l: &Links<S, D>,
        node: &Node<S, D>,
        name: &CStr,
        sm: &Meta,
        dm: Option<Meta>,
        led: Led<'_, S, D>,
    ) {
        let Led { leader, kept } = led;
        if let (Some(k), Some(d)) = (kept, dm) {
            if d.kind == Kind::File && id(&d) == k {
                // Already a name of the leader's file: its metadata is the leader's.
                Stats::add(&self.stats.unchanged, 1);
                return;
            }
        }
        let path = self.path(node, name.to_bytes());
        if self.dry_run {
            if let Some(dm) = &dm {
                let _ = self.keep_old(node.dst.as_ref(), name, &path, dm, true);
            }
            Stats::add(&self.stats.hard_links, 1);
            return self.rep.hard_link(&path, &leader.path());
        }
        let Some(d) = &node.dst else { return };
        // The link replaces the entry there atomically: kept first.
        if let Some(dm) = &dm {
            if let Err(e) = self.keep_old(Some(d), name, &path, dm, true) {
                return self.fail(&path, &e);
            }
        }
        let mut unlocked = false;
        let res = loop {
            let r = match leader.node.upgrade() {
                Some(n) => match &n.dst {
                    Some(from) => self.dst.link(from, &leader.name, d, name),
                    None => Err(io::Error::from(io::ErrorKind::NotFound)),
                },
                None => self
                    .open_dst_dir(&leader.dir)
                    .and_then(|from| self.dst.link(&from, &leader.name, d, name)),
            };
            match r {
                // A read-only directory (non-root): made writable for the
                // run, its mode set back when it completes.
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied && !unlocked => {
                    unlocked = true;
                    match self.dst.make_writable(d) {
                        Ok(true) => node.unlocked.store(true, Ordering::Relaxed),
                        _ => break Err(e),
                    }
                }
                r => break r,
            }
        };
        match res {
            Ok(()) => {
                node.dirty.store(true, Ordering::Relaxed);
                Stats::add(&self.stats.hard_links, 1);
                self.rep.hard_link(&path, &leader.path());
            }
            Err(e) if cannot_link(&e) => {
                if !l.unlinkable.swap(true, Ordering::Relaxed) {
                    let cause = e.to_string();
                    let cause = cause.split(" (os error").next().unwrap_or_default();
                    self.rep.note(&format!(
                        "-H: {} cannot be made a hard link of {} ({cause}): copied as a file (so is every name that cannot be linked)",
                        String::from_utf8_lossy(&path),
                        String::from_utf8_lossy(&leader.path())
                    ));
                }
                self.transfer(node, name, sm, dm, false);
            }
            Err(e) => self.fail(&path, &e),
        }
    }

    /// Open the destination directory at `rel` (a leader's, once the walk
    /// has closed it), one component at a time, following no symlink.
    fn open_dst_dir(&self, rel: &[u8]) -> io::Result<D::Dir> {
        let (mut dir, _) = self
            .dst
            .open_root()?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        for c in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            let c = CString::new(c).map_err(io::Error::other)?;
            dir = self.dst.open_dir(&dir, &c)?;
        }
        Ok(dir)
    }
}
