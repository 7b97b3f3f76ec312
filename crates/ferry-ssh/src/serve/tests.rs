//! `ferry serve` over pipes, as the client speaks to it.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;

use ferry_engine::entry::Kind;

use crate::proto::{self, Req, Resp};

/// A server on pipes: (what the client writes, what it reads, the server).
fn start() -> (
    File,
    io::BufReader<File>,
    std::thread::JoinHandle<io::Result<()>>,
) {
    let (in_r, in_w) = rustix::pipe::pipe().unwrap();
    let (out_r, out_w) = rustix::pipe::pipe().unwrap();
    let server = std::thread::spawn(move || {
        crate::serve::serve_on(io::BufReader::new(File::from(in_r)), File::from(out_w))
    });
    let mut to = File::from(in_w);
    let mut from = io::BufReader::new(File::from(out_r));
    proto::write_hello(&mut to).unwrap();
    assert!(matches!(
        proto::read_hello(&mut from).unwrap(),
        proto::Hello::Ferry { .. }
    ));
    (to, from, server)
}

/// Ask `req` as request `id`; its reply's bytes.
fn ask(to: &mut File, from: &mut io::BufReader<File>, id: u64, req: &Req<'_>) -> Vec<u8> {
    to.write_all(&proto::frame(id, req)).unwrap();
    let (got, body) = proto::read_frame(from).unwrap().expect("a reply");
    assert_eq!(got, id);
    body
}

/// One request says what SRC or DST is and opens its tree: a directory
/// is listed by the handle `StatRoot` named, with no `Root` request; a
/// file is stated and nothing is opened; a missing path is `None`.
#[test]
fn one_request_resolves_a_location_and_opens_its_tree() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tree")).unwrap();
    std::fs::write(dir.path().join("tree/a"), b"x").unwrap();
    std::fs::write(dir.path().join("file"), b"yy").unwrap();
    std::os::unix::fs::symlink("tree", dir.path().join("link")).unwrap();
    let (mut to, mut from, server) = start();
    let at = |n: &str| dir.path().join(n).into_os_string();

    // A directory (named through a symlink, followed): stated and opened.
    let link = at("link");
    let body = ask(
        &mut to,
        &mut from,
        1,
        &Req::StatRoot {
            path: link.as_bytes(),
            dir: 100,
        },
    );
    match proto::decode::<Resp>(&body).unwrap() {
        Resp::Root {
            meta: Some(m),
            opened: true,
        } => assert_eq!(m.0.kind, Kind::Dir),
        r => panic!("{r:?}"),
    }
    let body = ask(&mut to, &mut from, 2, &Req::List { dir: 100 });
    match proto::decode::<Resp>(&body).unwrap() {
        Resp::Listing { names, .. } => assert_eq!(names, b"a\0"),
        r => panic!("{r:?}"),
    }

    // A file: stated, not opened (its handle is not one).
    let file = at("file");
    let body = ask(
        &mut to,
        &mut from,
        3,
        &Req::StatRoot {
            path: file.as_bytes(),
            dir: 101,
        },
    );
    match proto::decode::<Resp>(&body).unwrap() {
        Resp::Root {
            meta: Some(m),
            opened: false,
        } => assert_eq!((m.0.kind, m.0.size), (Kind::File, 2)),
        r => panic!("{r:?}"),
    }
    let body = ask(&mut to, &mut from, 4, &Req::List { dir: 101 });
    assert!(matches!(
        proto::decode::<Resp>(&body).unwrap(),
        Resp::Err(_)
    ));

    // Missing: none, nothing opened.
    let gone = at("gone");
    let body = ask(
        &mut to,
        &mut from,
        5,
        &Req::StatRoot {
            path: gone.as_bytes(),
            dir: 102,
        },
    );
    assert!(matches!(
        proto::decode::<Resp>(&body).unwrap(),
        Resp::Root {
            meta: None,
            opened: false
        }
    ));
    drop(to);
    server.join().unwrap().unwrap();
}

/// A directory's `List` sent right behind its `OpenDir`, before the open
/// is answered (protocol 14): the server opens directories in the order
/// the requests come, so every listing finds its handle (workers run the
/// listings at once; before, one could run before its open and find no
/// handle). A `List` behind an open that fails is an error, the open's
/// error its own.
#[test]
fn a_listing_sent_behind_its_open_finds_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..40 {
        let d = dir.path().join(format!("d{i:02}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), b"x").unwrap();
    }
    let (mut to, mut from, server) = start();
    let root = dir.path().as_os_str();
    ask(
        &mut to,
        &mut from,
        1,
        &Req::StatRoot {
            path: root.as_bytes(),
            dir: 100,
        },
    );
    // Each subdirectory's open and listing in one write, all of them, and
    // one open of a name that is not there, with its listing.
    let mut burst = Vec::new();
    let names: Vec<String> = (0..40).map(|i| format!("d{i:02}")).collect();
    for (i, n) in names.iter().chain(["gone".to_string()].iter()).enumerate() {
        let h = 200 + i as u64;
        burst.extend(proto::frame(
            2 * h,
            &Req::OpenDir {
                dir: 100,
                name: n.as_bytes(),
                new: h,
            },
        ));
        burst.extend(proto::frame(2 * h + 1, &Req::List { dir: h }));
    }
    to.write_all(&burst).unwrap();
    let mut replies = std::collections::HashMap::new();
    for _ in 0..2 * (names.len() + 1) {
        let (id, body) = proto::read_frame(&mut from).unwrap().expect("a reply");
        replies.insert(id, body);
    }
    for (i, n) in names.iter().enumerate() {
        let h = 200 + i as u64;
        assert!(
            matches!(proto::decode::<Resp>(&replies[&(2 * h)]).unwrap(), Resp::Ok),
            "{n}"
        );
        match proto::decode::<Resp>(&replies[&(2 * h + 1)]).unwrap() {
            Resp::Listing { names, .. } => assert_eq!(names, format!("f{i}\0").as_bytes(), "{n}"),
            r => panic!("{n}: {r:?}"),
        }
    }
    let h = 200 + names.len() as u64;
    for id in [2 * h, 2 * h + 1] {
        assert!(matches!(
            proto::decode::<Resp>(&replies[&id]).unwrap(),
            Resp::Err(_)
        ));
    }
    drop(to);
    server.join().unwrap().unwrap();
}
