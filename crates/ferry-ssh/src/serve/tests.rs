//! `ferry serve` over pipes, as the client speaks to it.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;

use ferry_engine::entry::Kind;

use crate::proto::{self, Req, Resp};

/// A server on pipes: what the client writes, what it reads, the server.
type Pipes = (
    File,
    io::BufReader<File>,
    std::thread::JoinHandle<io::Result<()>>,
);

/// A server on pipes, its hello read.
fn start() -> Pipes {
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

/// The tests of listings made ahead share this process's counters
/// ([`super::ahead::LISTED`], [`super::ahead::SERVED`]): one at a time.
static AHEAD: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

type Tree = std::collections::BTreeMap<Vec<u8>, Vec<(Vec<u8>, ferry_engine::Meta)>>;

/// Every directory of the tree at `root` as the server lists it, walked
/// as a run walks it (`StatRoot`, then each subdirectory's `OpenDir` and
/// `List` in one write): its path from the root, and its entries.
fn walk(to: &mut File, from: &mut io::BufReader<File>, root: &[u8]) -> Tree {
    let mut next = 1000u64;
    let mut id = || {
        next += 1;
        next
    };
    let (h, i) = (id(), id());
    match proto::decode::<Resp>(&ask(to, from, i, &Req::StatRoot { path: root, dir: h })).unwrap() {
        Resp::Root { opened: true, .. } => {}
        r => panic!("{r:?}"),
    }
    let l = id();
    let mut first = Some(ask(to, from, l, &Req::List { dir: h }));
    let mut out = Tree::new();
    let mut queue = std::collections::VecDeque::from([(Vec::new(), h)]);
    while let Some((rel, h)) = queue.pop_front() {
        let body = match first.take() {
            Some(b) => b,
            None => {
                // The open and the listing in one write; the two replies
                // in whichever order they come.
                let (parent, name) =
                    rel.split_at(rel.iter().rposition(|b| *b == b'/').map_or(0, |k| k + 1));
                let _ = parent;
                let (o, l) = (id(), id());
                let mut w = proto::frame(
                    o,
                    &Req::OpenDir {
                        dir: h >> 20,
                        name,
                        new: h & 0xfffff,
                    },
                );
                w.extend(proto::frame(l, &Req::List { dir: h & 0xfffff }));
                to.write_all(&w).unwrap();
                let mut replies = std::collections::HashMap::new();
                for _ in 0..2 {
                    let (got, body) = proto::read_frame(from).unwrap().expect("a reply");
                    replies.insert(got, body);
                }
                assert!(matches!(
                    proto::decode::<Resp>(&replies[&o]).unwrap(),
                    Resp::Ok
                ));
                replies.remove(&l).unwrap()
            }
        };
        let Resp::Listing {
            names,
            metas,
            errors,
        } = proto::decode::<Resp>(&body).unwrap()
        else {
            panic!("not a listing")
        };
        assert!(errors.is_empty());
        let entries: Vec<_> = names
            .split(|b| *b == 0)
            .zip(metas)
            .map(|(n, m)| (n.to_vec(), m.0))
            .collect();
        let own = h & 0xfffff;
        for (n, m) in &entries {
            if m.kind == Kind::Dir {
                let mut sub = rel.clone();
                if !sub.is_empty() {
                    sub.push(b'/');
                }
                sub.extend_from_slice(n);
                // The parent's handle above, the new one below.
                queue.push_back((sub, own << 20 | id()));
            }
        }
        out.insert(rel, entries);
    }
    out
}

/// [`walk`] over session `p`, then the session ended (its server's
/// end checked).
fn walk_and_end((mut to, mut from, server): Pipes, root: &[u8]) -> Tree {
    let t = walk(&mut to, &mut from, root);
    drop(to);
    server.join().unwrap().unwrap();
    t
}

/// What a walk of `root` says now: on a new session, nothing listed ahead.
fn walk_now(root: &[u8]) -> Tree {
    walk_and_end(start(), root)
}

/// Wait (at most a minute) until this process has listed `n` directories
/// ahead since `since`.
fn listed_ahead(since: usize, n: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while super::ahead::LISTED.load(Relaxed) < since + n {
        assert!(std::time::Instant::now() < deadline, "not listed ahead");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A server asked to list the tree at `root` ahead, and `n` directories
/// of it listed ahead: [`super::ahead::LISTED`] and
/// [`super::ahead::SERVED`] before, the server.
fn list_ahead(root: &std::path::Path, n: usize) -> (usize, usize, Pipes) {
    use std::sync::atomic::Ordering::Relaxed;
    let listed = super::ahead::LISTED.load(Relaxed);
    let served = super::ahead::SERVED.load(Relaxed);
    let (mut to, from, server) = start();
    let path = root.as_os_str().as_bytes();
    to.write_all(&proto::frame(0, &Req::ListAhead { path }))
        .unwrap();
    listed_ahead(listed, n);
    (listed, served, (to, from, server))
}

/// [`ahead_tree`] made at `root`, a server asked to list it ahead, and
/// all of it listed ahead: [`super::ahead::SERVED`] before, the server.
fn listed_ahead_there(root: &std::path::Path) -> (usize, Pipes) {
    ahead_tree(root);
    let (_, served, pipes) = list_ahead(root, 11);
    (served, pipes)
}

/// A tree: five directories of three files and a subdirectory `x` of two.
fn ahead_tree(root: &std::path::Path) {
    for d in ["a", "b", "c", "d", "e"] {
        for f in ["f0", "f1", "f2", "x/g0", "x/g1"] {
            let p = root.join(d).join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, f.as_bytes()).unwrap();
        }
    }
}

/// The same listings as a walk made now: every name and kind, every
/// file's metadata to the ctime, every directory's inode. (A listing made
/// ahead may keep an earlier mtime of a subdirectory whose own entries
/// changed: a change to an entry in place, which its parent's ctime does
/// not show.)
fn assert_same_listings(got: &Tree, want: &Tree) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (rel, w) in want {
        let g = &got[rel];
        let names = |l: &[(Vec<u8>, ferry_engine::Meta)]| -> Vec<(Vec<u8>, Kind)> {
            l.iter().map(|(n, m)| (n.clone(), m.kind)).collect()
        };
        assert_eq!(names(g), names(w), "{}", String::from_utf8_lossy(rel));
        for ((n, a), (_, b)) in g.iter().zip(w) {
            let at = format!(
                "{}/{}",
                String::from_utf8_lossy(rel),
                String::from_utf8_lossy(n)
            );
            if a.kind == Kind::Dir {
                assert_eq!(a.ino, b.ino, "{at}");
            } else {
                assert_eq!((a, a.ctime), (b, b.ctime), "{at}");
            }
        }
    }
}

/// Listings made ahead (`ListAhead`, protocol 15) answer a walk as a walk
/// made then would be answered, whatever changed behind ferry's back in
/// between: a file added, one removed, one renamed, a directory replaced
/// by another of the same name, a directory's mode changed. The
/// directories nothing changed in are answered from what was made ahead.
#[test]
fn listings_made_ahead_answer_as_listings_made_then() {
    use std::sync::atomic::Ordering::Relaxed;
    let _one = AHEAD.lock();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t");
    let (served, pipes) = listed_ahead_there(&root);
    let path = root.as_os_str().as_bytes();
    // Behind its back.
    std::fs::write(root.join("a/new"), b"new").unwrap();
    std::fs::remove_file(root.join("b/f0")).unwrap();
    std::fs::rename(root.join("c/f0"), root.join("c/g0")).unwrap();
    std::fs::rename(root.join("d"), root.join("d.old")).unwrap();
    std::fs::create_dir_all(root.join("d/x")).unwrap();
    std::fs::write(root.join("d/other"), b"o").unwrap();
    let mut p = std::fs::metadata(root.join("e")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o700);
    std::fs::set_permissions(root.join("e"), p).unwrap();
    let got = walk_and_end(pipes, path);
    // What a walk says now, without listings made ahead.
    let want = walk_now(path);
    assert_same_listings(&got, &want);
    assert!(want[&b"a".to_vec()].iter().any(|(n, _)| n == b"new"));
    assert!(want[&b"d".to_vec()].iter().any(|(n, _)| n == b"other"));
    // a/x, b/x, c/x, d.old/x, e/x at least (their directories untouched).
    assert!(super::ahead::SERVED.load(Relaxed) >= served + 5);
}

/// Hostile names and symlinks in a tree listed ahead: names with a
/// newline, a byte that is not UTF-8, a leading dash or blank, 255 bytes
/// long, are listed ahead as they are and served as a listing made then
/// would be; a symlink to a directory outside the tree, and one to a
/// directory inside it, are entries, never followed (nothing outside is
/// listed, nothing inside twice).
#[test]
fn listings_made_ahead_keep_odd_names_and_follow_no_symlink() {
    use std::os::unix::ffi::OsStrExt;
    use std::sync::atomic::Ordering::Relaxed;
    let _one = AHEAD.lock();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t");
    let long = vec![b'l'; 255];
    let odd: [&[u8]; 5] = [b"new\nline", b"caf\xe9", b"-dash", b" lead", &long];
    for d in odd {
        let d = root.join(std::ffi::OsStr::from_bytes(d));
        std::fs::create_dir_all(d.join("x")).unwrap();
        std::fs::write(d.join(std::ffi::OsStr::from_bytes(b"f\n\xff")), b"f").unwrap();
        std::fs::write(d.join("x/g"), b"g").unwrap();
    }
    let outside = dir.path().join("outside");
    for d in ["a", "b", "c"] {
        std::fs::create_dir_all(outside.join(d)).unwrap();
    }
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    std::os::unix::fs::symlink("-dash", root.join("in")).unwrap();
    // The root, five directories and their five `x`.
    let (listed, served, pipes) = list_ahead(&root, 11);
    let path = root.as_os_str().as_bytes();
    let got = walk_and_end(pipes, path);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(super::ahead::LISTED.load(Relaxed), listed + 11);
    let want = walk_now(path);
    assert_same_listings(&got, &want);
    for d in odd {
        let names: Vec<&[u8]> = want[d].iter().map(|(n, _)| n.as_slice()).collect();
        assert_eq!(
            names,
            [&b"f\n\xff"[..], b"x"],
            "{}",
            String::from_utf8_lossy(d)
        );
    }
    let kinds: Vec<(&[u8], Kind)> = want[&Vec::new()]
        .iter()
        .filter(|(n, _)| n == b"out" || n == b"in")
        .map(|(n, m)| (n.as_slice(), m.kind))
        .collect();
    assert_eq!(
        kinds,
        [(&b"in"[..], Kind::Symlink), (b"out", Kind::Symlink)]
    );
    // Every directory but the root (asked for with StatRoot) served ahead.
    assert!(super::ahead::SERVED.load(Relaxed) >= served + 10);
}

/// A change the client asks for ends the listing ahead: a file's mode set
/// through the session (which changes nothing its directory's ctime
/// shows) is in the listing that follows, and nothing made ahead is used
/// from then on. A tree that is not a directory (a file, a missing path)
/// is not listed ahead, and the session serves as without.
#[test]
fn a_change_by_the_client_ends_the_listing_ahead() {
    use std::sync::atomic::Ordering::Relaxed;
    let _one = AHEAD.lock();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t");
    let (served, (mut to, mut from, server)) = listed_ahead_there(&root);
    let path = root.as_os_str().as_bytes();
    let body = ask(&mut to, &mut from, 1, &Req::StatRoot { path, dir: 100 });
    assert!(matches!(
        proto::decode::<Resp>(&body).unwrap(),
        Resp::Root { opened: true, .. }
    ));
    let body = ask(
        &mut to,
        &mut from,
        2,
        &Req::OpenDir {
            dir: 100,
            name: b"a",
            new: 101,
        },
    );
    assert!(matches!(proto::decode::<Resp>(&body).unwrap(), Resp::Ok));
    let mut m = match proto::decode::<Resp>(&ask(
        &mut to,
        &mut from,
        3,
        &Req::Stat {
            dir: 101,
            name: b"f1",
        },
    ))
    .unwrap()
    {
        Resp::Meta(Some(m)) => m.0,
        r => panic!("{r:?}"),
    };
    m.mode = 0o600;
    let what = proto::what_bits(ferry_engine::store::MetaChange {
        mode: true,
        ..Default::default()
    });
    let body = ask(
        &mut to,
        &mut from,
        4,
        &Req::SetMeta {
            dir: 101,
            name: b"f1",
            meta: proto::M(m),
            what,
        },
    );
    assert!(
        matches!(proto::decode::<Resp>(&body).unwrap(), Resp::Ok),
        "{:?}",
        proto::decode::<Resp>(&body)
    );
    match proto::decode::<Resp>(&ask(&mut to, &mut from, 5, &Req::List { dir: 101 })).unwrap() {
        Resp::Listing { names, metas, .. } => {
            let f1 = names.split(|b| *b == 0).position(|n| n == b"f1").unwrap();
            assert_eq!(metas[f1].0.mode, 0o600);
        }
        r => panic!("{r:?}"),
    }
    let got = walk_and_end((to, from, server), path);
    assert_eq!(
        super::ahead::SERVED.load(Relaxed),
        served,
        "nothing made ahead used"
    );
    let (mut to, mut from, server) = start();
    assert_same_listings(&got, &walk(&mut to, &mut from, path));
    // A file, and a path not there: nothing listed ahead, nothing broken.
    for p in [root.join("a/f0"), root.join("gone")] {
        let listed = super::ahead::LISTED.load(Relaxed);
        to.write_all(&proto::frame(
            0,
            &Req::ListAhead {
                path: p.as_os_str().as_bytes(),
            },
        ))
        .unwrap();
        let body = ask(
            &mut to,
            &mut from,
            6,
            &Req::StatRoot {
                path: p.as_os_str().as_bytes(),
                dir: 300,
            },
        );
        assert!(matches!(
            proto::decode::<Resp>(&body).unwrap(),
            Resp::Root { opened: false, .. }
        ));
        assert_eq!(super::ahead::LISTED.load(Relaxed), listed);
    }
    drop(to);
    server.join().unwrap().unwrap();
}

/// A listing made ahead is used only while fresh ([`super::ahead::FRESH`]):
/// a file written in place behind ferry's back (its directory's ctime
/// untouched) shows in a walk made after that.
#[test]
fn a_listing_made_ahead_goes_stale() {
    let _one = AHEAD.lock();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t");
    let (_, pipes) = listed_ahead_there(&root);
    let path = root.as_os_str().as_bytes();
    std::fs::write(root.join("a/x/g0"), b"changed in place, longer").unwrap();
    std::thread::sleep(super::ahead::FRESH + std::time::Duration::from_millis(200));
    let got = walk_and_end(pipes, path);
    let g0 = &got[&b"a/x".to_vec()]
        .iter()
        .find(|(n, _)| n == b"g0")
        .unwrap()
        .1;
    assert_eq!(g0.size, 24);
}

/// A serve started with the walked tree (`serve --walk-ahead=PATH`) lists
/// its root once: the listing ahead the client asks for with its hello
/// (`ListAhead`, in every run's first flight) goes on from the root's
/// subdirectories, and does not list the root again (a root of 500,000
/// files was listed twice). A root of files only, and a tree.
#[test]
fn a_root_answered_unasked_is_listed_once() {
    use std::os::unix::fs::MetadataExt;
    let _one = AHEAD.lock();
    let times = |key: (u64, u64)| {
        let l = super::answer::LISTINGS.lock();
        l.iter().filter(|k| **k == key).count()
    };
    for tree in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        std::fs::create_dir(&root).unwrap();
        if tree {
            ahead_tree(&root);
        } else {
            for f in ["f0", "f1", "f2"] {
                std::fs::write(root.join(f), f).unwrap();
            }
        }
        let key = |p: &std::path::Path| {
            let m = std::fs::metadata(p).unwrap();
            (m.dev(), m.ino())
        };
        let mut dirs = vec![key(&root)];
        if tree {
            for d in ["a", "b", "c", "d", "e"] {
                dirs.push(key(&root.join(d)));
                dirs.push(key(&root.join(d).join("x")));
            }
        }
        // (An inode of an earlier test's directory may come back.)
        let before: Vec<_> = dirs.iter().map(|k| times(*k)).collect();
        let (in_r, in_w) = rustix::pipe::pipe().unwrap();
        let (out_r, out_w) = rustix::pipe::pipe().unwrap();
        let path = root.as_os_str().as_bytes().to_vec();
        let server = std::thread::spawn(move || {
            crate::serve::serve_on_pushing(
                io::BufReader::new(File::from(in_r)),
                File::from(out_w),
                Some(&path),
            )
        });
        let (mut to, mut from) = (File::from(in_w), io::BufReader::new(File::from(out_r)));
        // The first flight, as a run sends it: the hello, the listing
        // ahead, and (to know they were read) a ping.
        let mut w = Vec::new();
        proto::write_hello(&mut w).unwrap();
        let path = root.as_os_str().as_bytes();
        w.extend(proto::frame(0, &Req::ListAhead { path }));
        w.extend(proto::frame(9, &Req::Ping));
        to.write_all(&w).unwrap();
        assert!(matches!(
            proto::read_hello(&mut from).unwrap(),
            proto::Hello::Ferry { .. }
        ));
        while proto::read_frame(&mut from).unwrap().expect("a reply").0 != 9 {}
        // Every directory listed (answered unasked, or ahead), and a
        // moment for a second listing of the root to show.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while dirs.iter().zip(&before).any(|(k, b)| times(*k) == *b) {
            assert!(std::time::Instant::now() < deadline, "not all listed");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(
            times(dirs[0]) - before[0],
            1,
            "the root's listings (tree: {tree})"
        );
        drop(to);
        server.join().unwrap().unwrap();
    }
}
