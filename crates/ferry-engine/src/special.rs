//! setuid, setgid and sticky bits (`0o7000`) from a store that is not this
//! machine's own filesystem.
//!
//! A mode read from object metadata (S3's `x-amz-meta-mode`), or from
//! another host (SSH, SFTP), is whatever anyone who could write there chose:
//! `mode=104777` on an object would make a root-owned `-rwsrwxrwx` file on
//! the machine that downloads it. So a mode from such a store reaches a file
//! without those three bits unless the run was asked for them
//! (`--keep-special-bits`); the run says once that it dropped some. Modes
//! from a local directory ([`crate::store::Features::local_modes`]) are kept whole, as `cp -a`
//! and `rsync -a` keep them, and a store that keeps modes only as metadata
//! (S3: [`crate::store::Features::dir_meta`] false) gets them whole too, since no file
//! has them there.
//!
//! The rule is applied where a source's metadata enters a run (its listings
//! and `stat`s, and the exact metadata a reader learns), so what is compared
//! is what is written: a run converges (the destination's file without the
//! bits is the source's file, not a change to redo every run).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::entry::{Kind, Listing, Meta};
use crate::store::Store;

/// setuid, setgid and sticky.
pub const SPECIAL_BITS: u32 = 0o7000;

/// Whether a run drops the special bits of its source's modes, and whether
/// it dropped any (for its one note).
#[derive(Debug, Default)]
pub struct SpecialBits {
    strip: bool,
    dropped: AtomicBool,
}

impl SpecialBits {
    /// The rule of a run writing `dst` from `src`: the bits are dropped when
    /// `src`'s modes are not this machine's ([`crate::store::Features::local_modes`]), `dst`
    /// makes them permission bits of files ([`crate::store::Features::dir_meta`]: not an
    /// object store) and `keep` (`--keep-special-bits`) is off.
    pub fn new<S: Store, D: Store>(src: &S, dst: &D, keep: bool) -> SpecialBits {
        SpecialBits::stripping(!keep && !src.features().local_modes && dst.features().dir_meta)
    }

    /// A rule that drops the bits (`strip`) or keeps them.
    pub fn stripping(strip: bool) -> SpecialBits {
        SpecialBits {
            strip,
            dropped: AtomicBool::new(false),
        }
    }

    /// True when the bits are dropped.
    pub fn strips(&self) -> bool {
        self.strip
    }

    /// `m` as it may be applied: without the bits when they are dropped.
    pub fn apply(&self, m: &Meta) -> Meta {
        let mut m = *m;
        self.fix(&mut m);
        m
    }

    /// Drop the bits of `m` in place when the rule says so.
    pub fn fix(&self, m: &mut Meta) {
        if self.strip && m.mode & SPECIAL_BITS != 0 && m.kind != Kind::Symlink {
            m.mode &= !SPECIAL_BITS;
            self.dropped.store(true, Ordering::Relaxed);
        }
    }

    /// [`SpecialBits::fix`] every entry of `list`.
    pub fn fix_list(&self, list: &mut Listing) {
        if !self.strip {
            return;
        }
        for e in list.entries_mut() {
            self.fix(&mut e.meta);
        }
    }

    /// The run's one note when it dropped bits that `side` (`SRC`, `A`,
    /// `B`) had.
    pub fn note(&self, side: &str) -> Option<String> {
        self.dropped.load(Ordering::Relaxed).then(|| {
            format!(
                "setuid, setgid and sticky bits of {side} were dropped (modes from S3, SSH or \
                 SFTP are applied without them; --keep-special-bits keeps them)"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kind: Kind, mode: u32) -> Meta {
        Meta {
            kind,
            size: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
            mode,
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

    #[test]
    fn drops_only_the_special_bits_and_says_so_once() {
        let s = SpecialBits::stripping(true);
        assert_eq!(s.note("SRC"), None);
        assert_eq!(s.apply(&meta(Kind::File, 0o644)).mode, 0o644);
        assert_eq!(s.note("SRC"), None, "nothing dropped yet");
        assert_eq!(s.apply(&meta(Kind::File, 0o4777)).mode, 0o777);
        assert_eq!(s.apply(&meta(Kind::Dir, 0o3775)).mode, 0o775);
        assert_eq!(s.apply(&meta(Kind::Dir, 0o1777)).mode, 0o777);
        assert!(s.note("B").unwrap().contains("of B were dropped"));
        let k = SpecialBits::stripping(false);
        assert_eq!(k.apply(&meta(Kind::File, 0o6755)).mode, 0o6755);
        assert_eq!(k.note("SRC"), None);
    }
}
