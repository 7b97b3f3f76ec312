use super::*;

#[test]
fn headers_round_trip_and_short_ones_are_refused() {
    let h = Head {
        ino: 7,
        old: 1 << 30,
        new: (1 << 30) + 5,
        sec: -3,
        nsec: 999,
        mode: 0o100644,
        name: b"a\xffb".to_vec(),
        key: [9u8; 32],
        blocks: vec![(0, 8192, 5), (1 << 20, 16384, u32::MAX)],
    };
    let mut b = h.encode();
    let n = b.len();
    b.extend_from_slice(b"more");
    assert_eq!(Head::decode(&b), Some((h, n)));
    for k in 0..n {
        assert!(Head::decode(&b[..k]).is_none());
    }
}

use ferry_engine::delta::inplace::{differing, fd_patch_hashes};
use ferry_engine::entry::Kind;
use proptest::prelude::*;

/// The metadata of `name` in `dir` as a listing gives it.
fn meta_of(dir: BorrowedFd<'_>, name: &CStr) -> Meta {
    let st = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).unwrap();
    Meta {
        kind: Kind::File,
        size: st.st_size as u64,
        mtime_sec: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec as u32,
        mode: st.st_mode,
        ino: st.st_ino,
        ..crate::local::EMPTY_META
    }
}

/// A patch of `old` to `new` in a fresh directory, `cut` of its
/// writes done; then committed (`commit`), or left as a killed run
/// leaves it and rolled back by the recovery a listing runs. Returns
/// the file's bytes and mtime after, and what is left in the directory.
fn patch(
    old: &[u8],
    new: &[u8],
    cut: usize,
    commit: bool,
) -> (Vec<u8>, (i64, u32), Vec<std::ffi::OsString>, bool) {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("f"), old).unwrap();
    let dir = rfs::open(d.path(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
    let f = rfs::openat(&dir, c"f", OFlags::WRONLY, Mode::empty()).unwrap();
    let then = mtime(1_500_000_000, 123);
    rfs::futimens(&f, &crate::local::times(&then)).unwrap();
    drop(f);
    let m = meta_of(dir.as_fd(), c"f");
    let l = Layout::new(old.len() as u64, new.len() as u64);
    let key = delta::new_key();
    let mut p = LocalPatch::start(dir.as_fd(), c"f", &m, false, &l, &key)
        .unwrap()
        .unwrap();
    let ours = p.blocks_here().unwrap();
    let mut src = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut src, new).unwrap();
    let theirs = fd_patch_hashes(src.as_fd(), &l, &key).unwrap();
    let changed = differing(&theirs.list, &ours).unwrap();
    let new_hashes: Vec<u64> = changed.iter().map(|&i| theirs.list[i as usize]).collect();
    assert!(p.begin_here(&changed, &new_hashes).unwrap());
    let mut writes: Vec<(u64, usize)> = changed.iter().map(|&i| l.span(i as usize)).collect();
    let mut at = l.old;
    while at < l.new {
        let n = ((l.new - at) as usize).min(7000);
        writes.push((at, n));
        at += n as u64;
    }
    let done = cut.min(writes.len());
    for &(at, n) in &writes[..done] {
        p.write_here(at, &new[at as usize..at as usize + n])
            .unwrap();
    }
    let meta = Meta {
        size: new.len() as u64,
        mtime_sec: 1_600_000_000,
        mtime_nsec: 7,
        mode: m.mode,
        ..m
    };
    let committed = commit && done == writes.len();
    if committed {
        p.commit_here(&theirs.root, &meta, false).unwrap();
    } else if commit {
        // Not every block came: refused, rolled back.
        assert!(p.commit_here(&theirs.root, &meta, false).is_err());
    } else {
        // Killed: the record stays, its lock gone with the process.
        let (rec, rfd, _) = p.record.take().unwrap();
        drop(rfd);
        drop(p);
        assert!(crate::append::recover(dir.as_fd(), &rec).unwrap());
    }
    let m = meta_of(dir.as_fd(), c"f");
    let left = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "f")
        .collect();
    let bytes = std::fs::read(d.path().join("f")).unwrap();
    (bytes, (m.mtime_sec, m.mtime_nsec), left, committed)
}

/// A run killed between two writes of a patch, then another program
/// writes into a block the patch did not touch (or changes the mode):
/// the file's ctime is not the one the run left, so the recovery
/// leaves the file as that program left it and only removes the
/// record. Untouched, the same recovery rolls the file back.
#[test]
fn a_change_after_a_clean_kill_is_left_alone() {
    use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
    for later in 0..3 {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let old: Vec<u8> = (0..100_000u32).map(|i| ((i * 7) >> 3) as u8).collect();
        let mut new = old.clone();
        new[9000] ^= 1;
        std::fs::write(&p, &old).unwrap();
        let dir = rfs::open(d.path(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
        let m = meta_of(dir.as_fd(), c"f");
        let l = Layout::new(old.len() as u64, new.len() as u64);
        let key = delta::new_key();
        let mut lp = LocalPatch::start(dir.as_fd(), c"f", &m, false, &l, &key)
            .unwrap()
            .unwrap();
        let ours = lp.blocks_here().unwrap();
        let mut src = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut src, &new).unwrap();
        let theirs = fd_patch_hashes(src.as_fd(), &l, &key).unwrap();
        let changed = differing(&theirs.list, &ours).unwrap();
        assert_eq!(changed, vec![1]);
        assert!(lp.begin_here(&changed, &[theirs.list[1]]).unwrap());
        lp.write_here(8192, &new[8192..16384]).unwrap();
        let (rec, rfd, _) = lp.record.take().unwrap();
        drop(rfd);
        drop(lp);
        let left = std::fs::metadata(&p).unwrap();
        // The coarse clock past the run's last ctime (else a write in
        // the same tick leaves the ctime as it was).
        let probe = d.path().join("probe");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            std::fs::write(&probe, b"x").unwrap();
            let c = std::fs::metadata(&probe).unwrap();
            if (c.ctime(), c.ctime_nsec()) > (left.ctime(), left.ctime_nsec()) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the clock stands still"
            );
        }
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        match later {
            0 => f.write_all_at(b"LATER", 50_000).unwrap(),
            1 => f
                .set_permissions(std::fs::Permissions::from_mode(0o600))
                .unwrap(),
            _ => {}
        }
        drop(f);
        let then = std::fs::read(&p).unwrap();
        assert!(crate::append::recover(dir.as_fd(), &rec).unwrap());
        let now = std::fs::read(&p).unwrap();
        if later < 2 {
            assert!(now == then, "rolled back over a later change ({later})");
            assert!(now[8192..16384] == new[8192..16384]);
        } else {
            assert!(now == old, "not rolled back");
        }
        assert!(!d.path().join(rec.to_str().unwrap()).exists());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random edits at fixed offsets (and a tail): committed, the file
    /// is the new content with the new mtime; killed at any point and
    /// recovered, it is the old content with the old mtime; nothing is
    /// left beside it.
    #[test]
    fn patched_in_place_or_rolled_back(
        size in 1usize..120_000,
        edits in prop::collection::vec((any::<prop::sample::Index>(), 1usize..5000, any::<u8>()), 0..6),
        tail in prop_oneof![Just(0usize), 1usize..40_000],
        cut in 0usize..60,
        commit in any::<bool>(),
        seed in any::<u32>(),
    ) {
        let old: Vec<u8> = (0..size as u32)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut new = old.clone();
        for (at, n, b) in &edits {
            let at = at.index(size);
            let end = (at + n).min(size);
            for x in &mut new[at..end] {
                *x ^= b | 1;
            }
        }
        new.extend((0..tail).map(|i| (i as u8).wrapping_mul(31)));
        let (bytes, mt, left, committed) = patch(&old, &new, cut, commit);
        prop_assert!(left.is_empty(), "{:?}", left);
        prop_assert!(committed || !commit || cut < 40);
        if committed {
            prop_assert!(bytes == new);
            prop_assert_eq!(mt, (1_600_000_000, 7));
        } else {
            prop_assert!(bytes == old);
            prop_assert_eq!(mt, (1_500_000_000, 123));
        }
    }
}
