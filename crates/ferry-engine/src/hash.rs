//! Content hashes as typed values, like rclone's `hash.Set`: a store says
//! which kinds it keeps without reading a file ([`HashStore::kinds`]) and
//! gives one ([`HashStore::hash`]); the engine compares two stored hashes of a
//! kind both sides keep, or hashes the other side's bytes with [`hash_bytes`].
//! What a backend's own fingerprints mean (an S3 ETag, multipart or not) is
//! the backend's business: it maps them to these kinds, and checks bytes
//! against fingerprints no kind expresses with [`HashStore::matches_bytes`].
//!
//! [`HashStore::kinds`]: crate::store::HashStore::kinds
//! [`HashStore::hash`]: crate::store::HashStore::hash
//! [`HashStore::matches_bytes`]: crate::store::HashStore::matches_bytes

use std::fmt;
use std::io;

use md5::{Digest, Md5};

use crate::store::SourceFile;

/// An algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashKind {
    /// MD5 of the whole content (16 bytes).
    Md5,
}

impl HashKind {
    /// Every kind, in order of preference.
    pub const ALL: [HashKind; 1] = [HashKind::Md5];

    fn bit(self) -> u8 {
        1 << self as u8
    }

    /// Lower-case name (messages).
    pub fn name(self) -> &'static str {
        match self {
            HashKind::Md5 => "md5",
        }
    }
}

/// A set of [`HashKind`]s (a bitset).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct HashSet(u8);

impl HashSet {
    /// No kind.
    pub const NONE: HashSet = HashSet(0);

    /// The set holding `kinds`.
    pub fn of(kinds: &[HashKind]) -> HashSet {
        HashSet(kinds.iter().fold(0, |b, k| b | k.bit()))
    }

    /// True when `kind` is in the set.
    pub fn contains(self, kind: HashKind) -> bool {
        self.0 & kind.bit() != 0
    }

    /// The kinds in both sets.
    pub fn intersection(self, other: HashSet) -> HashSet {
        HashSet(self.0 & other.0)
    }

    /// True when the set holds no kind.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The kinds in the set, most preferred first.
    pub fn iter(self) -> impl Iterator<Item = HashKind> {
        HashKind::ALL.into_iter().filter(move |k| self.contains(*k))
    }

    /// The most preferred kind in the set.
    pub fn first(self) -> Option<HashKind> {
        self.iter().next()
    }
}

impl fmt::Debug for HashSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(HashKind::name))
            .finish()
    }
}

/// One hash value, of its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    /// An MD5 digest.
    Md5([u8; 16]),
}

impl Hash {
    /// Its kind.
    pub fn kind(&self) -> HashKind {
        match self {
            Hash::Md5(_) => HashKind::Md5,
        }
    }

    /// The digest's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Hash::Md5(d) => d,
        }
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.bytes().iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Bytes read at a time while hashing.
const BUF: usize = 1 << 20;

/// The `kind` hash of everything `src` yields, and how many bytes that was.
pub fn hash_bytes(src: &mut dyn SourceFile, kind: HashKind) -> io::Result<(Hash, u64)> {
    let mut buf = vec![0u8; BUF];
    match kind {
        HashKind::Md5 => {
            let mut h = Md5::new();
            let n = feed(src, u64::MAX, &mut buf, &mut |b| h.update(b))?;
            let mut d = [0u8; 16];
            d.copy_from_slice(&h.finalize());
            Ok((Hash::Md5(d), n))
        }
    }
}

/// Hand up to `limit` bytes of `src` to `each` as they are read through
/// `buf`; returns how many were read (fewer at the end of the file).
/// Backends that hash the content in pieces (S3 multipart ETags) use it too.
pub fn feed(
    src: &mut dyn SourceFile,
    limit: u64,
    buf: &mut [u8],
    each: &mut dyn FnMut(&[u8]),
) -> io::Result<u64> {
    let mut n = 0u64;
    while n < limit {
        let want = (limit - n).min(buf.len() as u64) as usize;
        let k = src.read(&mut buf[..want])?;
        if k == 0 {
            break;
        }
        each(&buf[..k]);
        n += k as u64;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::BorrowedFd;

    struct Mem(&'static [u8]);
    impl SourceFile for Mem {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.0.len()).min(3);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
        fn as_fd(&self) -> Option<BorrowedFd<'_>> {
            None
        }
    }

    #[test]
    fn sets_hold_what_they_are_given() {
        let none = HashSet::NONE;
        let md5 = HashSet::of(&[HashKind::Md5]);
        assert!(none.is_empty() && !none.contains(HashKind::Md5));
        assert_eq!(none.first(), None);
        assert!(md5.contains(HashKind::Md5) && !md5.is_empty());
        assert_eq!(md5.first(), Some(HashKind::Md5));
        assert_eq!(md5.iter().collect::<Vec<_>>(), [HashKind::Md5]);
        assert_eq!(md5.intersection(none), none);
        assert_eq!(md5.intersection(md5), md5);
        assert_eq!(HashSet::of(&[HashKind::Md5, HashKind::Md5]), md5);
        assert_eq!(format!("{md5:?} {none:?}"), "{\"md5\"} {}");
    }

    #[test]
    fn md5_of_bytes_read_in_pieces() {
        let (h, n) = hash_bytes(&mut Mem(b"hello world"), HashKind::Md5).unwrap();
        assert_eq!(n, 11);
        assert_eq!(h.kind(), HashKind::Md5);
        assert_eq!(h.to_string(), "5eb63bbbe01eeed093cb22bb8f5acdc3");
        let (e, n) = hash_bytes(&mut Mem(b""), HashKind::Md5).unwrap();
        assert_eq!(n, 0);
        assert_eq!(e.to_string(), "d41d8cd98f00b204e9800998ecf8427e");
        assert_ne!(h, e);
    }
}
