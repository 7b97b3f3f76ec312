use super::*;

proptest::proptest! {
    /// The cut is the largest multiple of the step not above the
    /// mtime's nanoseconds, and cutting again changes nothing (the
    /// listings are cut, then the copy's checks cut again).
    #[test]
    fn mtimes_are_cut_to_the_step(nsec in 0u32..1_000_000_000, step in proptest::prop_oneof![
        proptest::prelude::Just(0u32), proptest::prelude::Just(1u32),
        proptest::prelude::Just(1_000u32), proptest::prelude::Just(1_000_000_000u32), 1u32..2_000_000_000
    ]) {
        let c = cut_nsec(nsec, step);
        let s = step.max(1);
        proptest::prop_assert!(c <= nsec && nsec - c < s && c.is_multiple_of(s));
        proptest::prop_assert_eq!(cut_nsec(c, step), c);
    }
}

#[test]
fn a_plan_holds_while_the_change_time_is_the_same_where_both_know_it() {
    let m = Meta {
        kind: Kind::File,
        size: 3,
        mtime_sec: 10,
        mtime_nsec: 5,
        mode: 0o644,
        uid: 0,
        gid: 0,
        ino: 7,
        version: 0,
        rdev: 0,
        sparse: false,
        nlink: 1,
        dev: 1,
        ctime: 100,
    };
    let p = Planned::new(&m, 1);
    assert!(p.holds(Some(&m)));
    // Edited behind its size and mtime: the change time moved.
    assert!(!p.holds(Some(&Meta { ctime: 101, ..m })));
    // Unknown on either side: not compared.
    assert!(p.holds(Some(&Meta { ctime: 0, ..m })));
    assert!(Planned::new(&Meta { ctime: 0, ..m }, 1).holds(Some(&Meta { ctime: 101, ..m })));
    // A file with several names, listed or now (the run's acts on the
    // others, the link of a keep, move it): not compared.
    assert!(p.holds(Some(&Meta {
        ctime: 101,
        nlink: 2,
        ..m
    })));
    let h = Planned::new(&Meta { nlink: 2, ..m }, 1);
    assert!(h.holds(Some(&Meta {
        ctime: 101,
        nlink: 1,
        ..m
    })));
    // Several names when listed and still several: not its last name, so
    // its size and mtime are not compared (the run's own meta change on
    // another name moves them); down to one name, they are.
    assert!(h.holds(Some(&Meta {
        mtime_sec: 11,
        size: 4,
        nlink: 3,
        ..m
    })));
    assert!(!h.holds(Some(&Meta {
        mtime_sec: 11,
        nlink: 1,
        ..m
    })));
    assert!(!p.holds(Some(&Meta {
        mtime_sec: 11,
        nlink: 2,
        ..m
    })));
    // Listed without an inode (a store that has none): compared in full.
    assert!(!Planned::new(
        &Meta {
            nlink: 2,
            ino: 0,
            ..m
        },
        1
    )
    .holds(Some(&Meta {
        mtime_sec: 11,
        nlink: 2,
        ..m
    })));
    // Another file at the name is never the one listed.
    assert!(!h.holds(Some(&Meta {
        ino: 8,
        nlink: 2,
        ..m
    })));
    // A directory: its entries move it.
    let d = Meta {
        kind: Kind::Dir,
        ..m
    };
    assert!(Planned::new(&d, 1).holds(Some(&Meta { ctime: 101, ..d })));
    // The rest as before.
    assert!(!p.holds(Some(&Meta { size: 4, ..m })));
    assert!(!p.holds(None));
}

#[test]
fn reserved_names_round_trip_and_user_names_are_not_reserved() {
    for id in [0u64, 1, 0xdead_beef, u64::MAX] {
        let t = temp_name(id);
        let p = partial_name(id);
        let (t, p) = (&t[..RESERVED_LEN], p.as_bytes());
        assert!(is_temp_name(t) && !is_partial_name(t), "{t:?}");
        assert!(is_temp_name(p) && is_partial_name(p), "{p:?}");
    }
    assert_eq!(
        &temp_name(0x0123_4567_89ab_cdef)[..],
        b".ferry-tmp-0123456789abcdef.~ferry~\0"
    );
    assert_eq!(
        partial_name(0xab).as_bytes(),
        b".ferry-part-00000000000000ab.~ferry~"
    );
    for user in [
        &b".ferry-tmp.12345"[..],
        b".ferry-tmp.part.0123456789abcdef",
        b".ferry-tmp-0123456789abcdef.~ferry",
        b".ferry-tmp-0123456789ABCDEF.~ferry~",
        b".ferry-tmp-0123456789abcde.~ferry~",
        b".ferry-tmp-0123456789abcdefx.~ferry~",
        b"x.ferry-tmp-0123456789abcdef.~ferry~",
        b".ferry-tmp-",
    ] {
        assert!(!is_temp_name(user), "{:?}", String::from_utf8_lossy(user));
    }
    assert!(is_legacy_partial_name(b".ferry-tmp.part.0123456789abcdef"));
    assert!(!is_legacy_partial_name(b".ferry-tmp.part.0123456789abcde"));
    assert!(!is_legacy_partial_name(b".ferry-tmp.part.0123456789abcdeg"));
}

#[test]
fn a_full_disk_says_what_is_needed_and_free() {
    let e = no_space(End::Dst, 1 << 30, Some((50 << 20, 10)));
    assert!(is_no_space(&e));
    assert_eq!(op_of(&e), Some((Some(End::Dst), "write")));
    assert_eq!(
        e.to_string(),
        "no space left on device: needs 1.0 GiB (1073741824 bytes), 50.0 MiB free"
    );
    let e = no_space(End::Dst, 2, Some((4096, 0)));
    assert_eq!(
        e.to_string(),
        "no space left on device: needs an inode and 2 bytes, no inode free"
    );
    assert!(is_no_space(&io::Error::from_raw_os_error(28)));
    assert!(!is_no_space(&io::Error::from_raw_os_error(2)));
    assert_eq!(bytes_text(1023), "1023 B");
    assert_eq!(bytes_text(1536), "1.5 KiB");
}
