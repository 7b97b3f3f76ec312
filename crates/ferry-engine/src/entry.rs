//! Entries and per-directory listings: what `scan` hands to `plan`.
//!
//! A [`Listing`] is one directory's entries, sorted by name bytes. Names live in
//! one arena (`names`), NUL-terminated so a backend can pass them straight to
//! `*at()` syscalls, and each [`ListEntry`] carries an 8-byte big-endian prefix
//! of its name so that sorting 500,000 entries mostly compares integers.

use std::cmp::Ordering;
use std::ffi::CStr;

/// What an entry is. Fifos and device nodes are created on the
/// destination as they are (no content, a device keeps [`Meta::rdev`]);
/// sockets and entries of types ferry does not know are skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed inside a tree).
    Symlink,
    /// Of a type ferry does not know.
    Other,
    /// A named pipe.
    Fifo,
    /// A character device node.
    CharDev,
    /// A block device node.
    BlockDev,
    /// A Unix domain socket (never copied).
    Socket,
}

impl Kind {
    /// Lower-case name used in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Other => "other",
            Kind::Fifo => "fifo",
            Kind::CharDev => "chardev",
            Kind::BlockDev => "blockdev",
            Kind::Socket => "socket",
        }
    }

    /// A fifo or device node: created on the destination with its
    /// metadata (and a device's `rdev`), no content.
    pub fn is_node(self) -> bool {
        matches!(self, Kind::Fifo | Kind::CharDev | Kind::BlockDev)
    }

    /// Anything but a file, directory or symlink.
    pub fn is_special(self) -> bool {
        !matches!(self, Kind::File | Kind::Dir | Kind::Symlink)
    }

    /// A kind that is never copied (sockets, unknown types).
    pub fn is_skipped(self) -> bool {
        matches!(self, Kind::Socket | Kind::Other)
    }
}

/// The metadata ferry compares and preserves.
#[derive(Clone, Copy, Debug)]
pub struct Meta {
    /// Entry type.
    pub kind: Kind,
    /// Size in bytes (for symlinks: length of the target).
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime_sec: i64,
    /// Nanoseconds part of the modification time.
    pub mtime_nsec: u32,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Inode number: kept by the entry when it is renamed (0 where the
    /// backend has no inodes, see `Features::inodes`).
    pub ino: u64,
    /// A fingerprint of the content's version, as the backend lists it (an
    /// object store's ETag and upload time; 0 where the backend has none):
    /// a different one is another version, the same one the same.
    pub version: u64,
    /// The device a device node stands for (`st_rdev`; 0 for other kinds
    /// and where the backend has none).
    pub rdev: u64,
    /// A file that occupies fewer blocks than its size needs
    /// (`st_blocks * 512 < st_size`, as `cp` tests it): it may have holes,
    /// which a local copy keeps (false where the backend cannot tell).
    pub sparse: bool,
    /// Number of names (hard links) of the inode, as listed; 0 or 1 where
    /// the backend has no hard links (see `PosixStore::hard_links`).
    pub nlink: u32,
    /// Device of the inode: with [`Meta::ino`], the identity that hard
    /// links share (0 where the backend has no inodes).
    pub dev: u64,
    /// The inode's change time (`st_ctime`) as nanoseconds since the
    /// epoch; 0 where the backend has none. No one can set it: any write,
    /// truncate, `utimensat`, chmod or link moves it, so the check at the
    /// act ([`crate::store::Planned`]) catches a write that put the size
    /// and mtime back. It is never compared between sides (two replicas
    /// never share one), nor kept anywhere (journal, plan).
    pub ctime: u64,
}

/// Equal: the same entry as ferry lists, compares and keeps it, every
/// field but [`Meta::ctime`] (a stamp of one inode's last change, which
/// only the check at the act compares, and which a record read back from
/// the journal does not have).
impl PartialEq for Meta {
    fn eq(&self, o: &Meta) -> bool {
        let Meta {
            kind,
            size,
            mtime_sec,
            mtime_nsec,
            mode,
            uid,
            gid,
            ino,
            version,
            rdev,
            sparse,
            nlink,
            dev,
            ctime: _,
        } = *self;
        kind == o.kind
            && size == o.size
            && mtime_sec == o.mtime_sec
            && mtime_nsec == o.mtime_nsec
            && mode == o.mode
            && uid == o.uid
            && gid == o.gid
            && ino == o.ino
            && version == o.version
            && rdev == o.rdev
            && sparse == o.sparse
            && nlink == o.nlink
            && dev == o.dev
    }
}

impl Eq for Meta {}

impl Meta {
    /// Modification time as nanoseconds since the epoch.
    pub fn mtime_ns(&self) -> i128 {
        self.mtime_sec as i128 * 1_000_000_000 + self.mtime_nsec as i128
    }

    /// Same modification time, to the nanosecond.
    pub fn same_mtime(&self, other: &Meta) -> bool {
        self.mtime_sec == other.mtime_sec && self.mtime_nsec == other.mtime_nsec
    }
}

/// One entry of a [`Listing`]: where its name sits in the arena, and its metadata.
#[derive(Clone, Copy, Debug)]
pub struct ListEntry {
    key: u64,
    off: u32,
    len: u32,
    /// The entry's metadata.
    pub meta: Meta,
}

impl ListEntry {
    /// Offset and length (without NUL) of the name in the listing's arena.
    pub fn name_span(&self) -> (usize, usize) {
        (self.off as usize, self.len as usize)
    }
}

/// One directory's entries, sorted by name (bytes) once [`Listing::sort`] ran.
#[derive(Default, Debug)]
pub struct Listing {
    names: Vec<u8>,
    entries: Vec<ListEntry>,
}

impl Listing {
    /// An empty listing.
    pub fn new() -> Listing {
        Listing::default()
    }

    /// Forget all entries, keeping the allocations.
    pub fn clear(&mut self) {
        self.names.clear();
        self.entries.clear();
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Append a name (without NUL) and its metadata.
    pub fn push(&mut self, name: &[u8], meta: Meta) {
        let off = self.names.len() as u32;
        self.names.extend_from_slice(name);
        self.names.push(0);
        self.entries.push(ListEntry {
            key: prefix_key(name),
            off,
            len: name.len() as u32,
            meta,
        });
    }

    /// The entries, in listing order.
    pub fn entries(&self) -> &[ListEntry] {
        &self.entries
    }

    /// Mutable access to the entries (metadata is filled in after names in
    /// the parallel stat path).
    pub fn entries_mut(&mut self) -> &mut [ListEntry] {
        &mut self.entries
    }

    /// The name arena and the entries, borrowed separately (the stat threads
    /// read names while each fills a disjoint slice of entries).
    pub fn parts_mut(&mut self) -> (&[u8], &mut [ListEntry]) {
        (&self.names, &mut self.entries)
    }

    /// Keep only the entries for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&ListEntry) -> bool) {
        self.entries.retain(|e| keep(e));
    }

    /// Keep only the entries whose name `keep` accepts.
    pub fn retain_names(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let names = &self.names;
        self.entries
            .retain(|e| keep(&names[e.off as usize..(e.off + e.len) as usize]));
    }

    /// Name of an entry, without the NUL.
    pub fn name(&self, e: &ListEntry) -> &[u8] {
        &self.names[e.off as usize..(e.off + e.len) as usize]
    }

    /// Name of an entry as a C string (for `*at()` syscalls).
    pub fn cname(&self, e: &ListEntry) -> &CStr {
        let bytes = &self.names[e.off as usize..(e.off + e.len + 1) as usize];
        CStr::from_bytes_with_nul(bytes).expect("listing names are NUL-terminated")
    }

    /// Sort entries by name bytes.
    pub fn sort(&mut self) {
        let names = &self.names;
        self.entries
            .sort_unstable_by(|a, b| cmp_entries(names, a, b));
    }

    /// True when the entries are strictly sorted by name (asserted by the planner).
    pub fn is_sorted(&self) -> bool {
        self.entries
            .windows(2)
            .all(|w| cmp_entries(&self.names, &w[0], &w[1]) == Ordering::Less)
    }
}

fn cmp_entries(names: &[u8], a: &ListEntry, b: &ListEntry) -> Ordering {
    a.key.cmp(&b.key).then_with(|| {
        let an = &names[a.off as usize..(a.off + a.len) as usize];
        let bn = &names[b.off as usize..(b.off + b.len) as usize];
        an.cmp(bn)
    })
}

/// First 8 bytes of a name, big-endian, zero padded: comparing keys orders
/// names like comparing the bytes, up to ties that the full compare breaks.
fn prefix_key(name: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = name.len().min(8);
    b[..n].copy_from_slice(&name[..n]);
    u64::from_be_bytes(b)
}

/// Call `f(i, j)` for each name at index `i` of `a` and `j` of `b` (both
/// sorted), in name order.
pub fn same_names(a: &Listing, b: &Listing, mut f: impl FnMut(usize, usize)) {
    let (ae, be) = (a.entries(), b.entries());
    let (mut i, mut j) = (0, 0);
    while i < ae.len() && j < be.len() {
        match a.name(&ae[i]).cmp(b.name(&be[j])) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                f(i, j);
                i += 1;
                j += 1;
            }
        }
    }
}

/// Join a relative directory path and a name with `/`.
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !dir.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn meta() -> Meta {
        Meta {
            kind: Kind::File,
            size: 0,
            mtime_sec: 0,
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

    proptest! {
        #[test]
        fn sort_orders_like_bytes(names in proptest::collection::btree_set(proptest::collection::vec(1u8..=255, 1..20), 0..200)) {
            let mut l = Listing::new();
            let mut shuffled: Vec<_> = names.iter().cloned().collect();
            shuffled.reverse();
            for n in &shuffled { l.push(n, meta()); }
            l.sort();
            let got: Vec<Vec<u8>> = l.entries().iter().map(|e| l.name(e).to_vec()).collect();
            let want: Vec<Vec<u8>> = names.into_iter().collect();
            prop_assert_eq!(got, want);
            prop_assert!(l.is_sorted());
        }
    }

    #[test]
    fn an_entry_stays_small() {
        // A listing holds one per entry (500,000 in one directory): the
        // change time took the 8 bytes it needs, no more (72 before).
        assert_eq!(std::mem::size_of::<Meta>(), 80);
        assert_eq!(std::mem::size_of::<ListEntry>(), 96);
    }

    #[test]
    fn equality_leaves_the_change_time_out() {
        let m = meta();
        assert_eq!(m, Meta { ctime: 12345, ..m });
        assert_ne!(m, Meta { nlink: 7, ..m });
    }

    #[test]
    fn cname_is_nul_terminated() {
        let mut l = Listing::new();
        l.push(b"abc", meta());
        l.push(b"x\xff", meta());
        assert_eq!(l.cname(&l.entries()[1]).to_bytes(), b"x\xff");
    }
}
