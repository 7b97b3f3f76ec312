use super::*;

#[test]
fn frames_built_around_their_content_are_the_frames_of_the_whole_message() {
    for n in [0usize, 1, 127, 128, 4096, 1 << 20, (1 << 20) + 3] {
        let data: Vec<u8> = (0..n).map(|i| i as u8).collect();
        for (file, offset) in [(0u64, 0u64), (300, 1 << 40), (u64::MAX, 5)] {
            let mut f = write_at_head(file, offset, n);
            f.extend_from_slice(&data);
            assert_eq!(
                f,
                frame(
                    0,
                    &Req::WriteAt {
                        file,
                        offset,
                        data: &data
                    }
                )
            );
        }
        for current in [None, Some((u64::MAX, -1i64, 7u32))] {
            let (mut f, tail) = data_parts(77, n, current);
            f.extend_from_slice(&data);
            f.extend_from_slice(&tail);
            assert_eq!(
                f,
                frame(
                    77,
                    &Resp::Data {
                        data: &data,
                        current,
                        zeros: Vec::new()
                    }
                )
            );
        }
    }
}

#[test]
fn big_data_replies_are_read_into_place_and_decode_as_read() {
    let data: Vec<u8> = (0..CHUNK as u32).map(|i| (i % 249) as u8).collect();
    let mut stream = Vec::new();
    let whole = |n: usize| {
        frame(
            7,
            &Resp::Data {
                data: &data[..n],
                current: Some((1, 2, 3)),
                zeros: Vec::new(),
            },
        )
    };
    for n in [CHUNK, 70_000, 10] {
        stream.extend(whole(n));
    }
    stream.extend(frame(8, &Resp::Bytes(&data[..100_000])));
    let mut r = &stream[..];
    let mut spare = Some(vec![0u8; PLACED_BUF]);
    for n in [CHUNK, 70_000, 10] {
        let (id, b) = read_placed(&mut r, || spare.take()).unwrap().unwrap();
        assert_eq!(id, 7);
        let body = crate::conn::Body(b);
        match body.get().unwrap() {
            Resp::Data {
                data: d, current, ..
            } => {
                assert_eq!(d, &data[..n]);
                assert_eq!(current, Some((1, 2, 3)));
                // Big ones sit aligned, small ones as they come.
                assert_eq!((d.as_ptr() as usize).is_multiple_of(4096), n >= 64 << 10);
            }
            r => panic!("{r:?}"),
        }
    }
    let (id, b) = read_placed(&mut r, || None).unwrap().unwrap();
    assert_eq!(id, 8);
    assert!(matches!(decode(&b).unwrap(), Resp::Bytes(x) if x == &data[..100_000]));
    assert!(read_placed(&mut r, || None).unwrap().is_none());
}

#[test]
fn write_at_heads_are_parsed_back() {
    for (file, offset, n) in [
        (0u64, 0u64, 0usize),
        (300, 1 << 40, 1 << 20),
        (u64::MAX, 5, 127),
    ] {
        let mut f = write_at_head(file, offset, n);
        let k = f.len() - 12;
        f.resize(f.len() + 40, 9);
        assert_eq!(parse_write_at(&f[12..]), Some((file, offset, k)));
    }
    let other = frame(
        0,
        &Req::Write {
            file: 1,
            data: &[0; 40],
        },
    );
    assert_eq!(parse_write_at(&other[12..]), None);
}

#[test]
fn piped_frames_are_written_head_content_tail_in_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Out>();
    let mut want = Vec::new();
    for (k, at) in [0u64, 4096, 99_000].into_iter().enumerate() {
        let small = frame(k as u64, &Resp::Count(k as u64));
        want.extend_from_slice(&small);
        tx.send(small.into()).unwrap();
        let Some(mut pipe) = crate::splice::pipe() else {
            return;
        };
        use std::os::fd::AsFd;
        let n = pipe.fill(file.as_fd(), at, 50_000).unwrap();
        let (head, tail) = data_parts(9, n, None);
        want.extend_from_slice(&head);
        want.extend_from_slice(&data[at as usize..at as usize + n]);
        want.extend_from_slice(&tail);
        tx.send(Out::Piped { head, pipe, tail }).unwrap();
    }
    drop(tx);
    let out = dir.path().join("out");
    write_out(std::fs::File::create(&out).unwrap(), rx);
    assert_eq!(std::fs::read(&out).unwrap(), want);
}

#[test]
fn a_changed_entry_comes_back_as_changed_and_other_errors_as_they_were() {
    use ferry_engine::store::{changed, is_changed};
    let back = |e: &io::Error| -> io::Error {
        let f = frame(1, &Resp::Err(e.into()));
        match decode::<Resp>(&f[12..]).unwrap() {
            Resp::Err(w) => w.into(),
            r => panic!("{r:?}"),
        }
    };
    assert!(is_changed(&back(&changed())));
    let e = back(&io::Error::from_raw_os_error(13));
    assert!(!is_changed(&e));
    assert_eq!(e.raw_os_error(), Some(13));
    let e = back(&io::Error::new(io::ErrorKind::NotFound, "gone"));
    assert!(!is_changed(&e));
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
}

#[test]
fn frames_and_hello_round_trip() {
    let mut b = Vec::new();
    write_hello(&mut b).unwrap();
    let meta = Meta {
        kind: Kind::Symlink,
        size: 5,
        mtime_sec: -3,
        mtime_nsec: 999_999_999,
        mode: 0o4755,
        uid: 1000,
        gid: 7,
        ino: u64::MAX,
        version: 3,
        rdev: 0x0103,
        sparse: true,
        nlink: 2,
        dev: 0x803,
        ctime: 1 << 63 | 1_700_000_000_123_456_789,
    };
    b.extend(frame(
        9,
        &Req::Put {
            dir: 1,
            name: b"a\xff",
            meta: M(meta),
            fsync: true,
            data: b"xyz",
            xattrs: Some((3, vec![(&b"user.a"[..], &b"\0\xff"[..])])),
            replacing: true,
            expect: Some(Some(P {
                meta: M(meta),
                step: 1000,
            })),
        },
    ));
    let mut r = &b[..];
    assert_eq!(
        read_hello(&mut r).unwrap(),
        Hello::Ferry {
            protocol: PROTOCOL,
            version: version().into()
        }
    );
    let (id, body) = read_frame(&mut r).unwrap().unwrap();
    assert_eq!(id, 9);
    match decode::<Req>(&body).unwrap() {
        Req::Put {
            dir: 1,
            name,
            meta: M(m),
            fsync: true,
            data,
            xattrs: Some((3, a)),
            replacing: true,
            expect:
                Some(Some(P {
                    meta: M(p),
                    step: 1000,
                })),
        } => {
            assert_eq!((name, m, data), (&b"a\xff"[..], meta, &b"xyz"[..]));
            // (`==` leaves the change time out: it travels too.)
            assert_eq!((m.ctime, p.ctime), (meta.ctime, meta.ctime));
            let mut x = Xattrs::new();
            xattrs_of(&a, &mut x);
            assert_eq!(x.get(b"user.a"), Some(&b"\0\xff"[..]));
            assert_eq!(sel_of(3), XattrSel::ALL);
        }
        other => panic!("{other:?}"),
    }
    assert!(read_frame(&mut r).unwrap().is_none());
    assert_eq!(
        read_hello(&mut &b"bash: ferry: command not found\n"[..]).unwrap(),
        Hello::Other(b"bash: ferry: comm".to_vec())
    );
}

#[test]
fn errors_keep_their_errno_or_kind() {
    let e: io::Error = WireErr::from(&io::Error::from_raw_os_error(39)).into();
    assert_eq!(e.raw_os_error(), Some(39));
    let e: io::Error = WireErr::from(&io::Error::new(io::ErrorKind::Unsupported, "x")).into();
    assert_eq!(
        (e.kind(), e.to_string()),
        (io::ErrorKind::Unsupported, "x".into())
    );
}
