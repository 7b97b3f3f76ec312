//! Tests of [`super`] (journal.rs).

use super::*;

fn m(kind: Kind, size: u64, ns: i64, ino: u64) -> Meta {
    let ctime = 1 << 63 | (ns as u64 + 17);
    meta(kind, size as i64, ns, 0o644, ino as i64, ctime)
}

/// A record as format 1 and 2 wrote it: no change times.
fn narrow(s: &Synced) -> Vec<u8> {
    let r = pack(s);
    let mut v = vec![r[0]];
    for side in r[1..].chunks(SIDE) {
        v.extend_from_slice(&side[..SIDE - 8]);
    }
    v
}

/// `s` as read back from a record without change times.
fn unknown_ctimes(s: Synced) -> Synced {
    Synced {
        a: Meta { ctime: 0, ..s.a },
        b: Meta { ctime: 0, ..s.b },
    }
}

#[test]
fn round_trip_in_key_order() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("j.sqlite");
    let j = Journal::open(&p, ("/a", "/b")).unwrap();
    let (tx, rx) = mpsc::channel();
    let s = Synced {
        a: m(Kind::File, 3, 1_500_000_000_123, 7),
        b: m(Kind::File, 3, 1_500_000_000_123, 9),
    };
    for k in [&b"b"[..], b"a\0z", b"a", b"a.x"] {
        tx.send(Update::Put(k.to_vec(), s)).unwrap();
    }
    tx.send(Update::Delete(b"b".to_vec())).unwrap();
    drop(tx);
    assert_eq!(j.write_from(rx).unwrap(), 5);
    drop(j);
    let j = Journal::open(&p, ("/a", "/b")).unwrap();
    let l = j.load().unwrap();
    let keys: Vec<Vec<u8>> = l.walk().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![b"a".to_vec(), b"a\0z".to_vec(), b"a.x".to_vec()]);
    assert_eq!(l.get(b"a"), Some(s));
    drop(j);
    let e = Journal::open(&p, ("/a", "/c"))
        .err()
        .expect("another pair is refused");
    assert!(matches!(e, super::JournalError::OtherPair { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "journal {} belongs to /a and /b, not to /a and /c",
            p.display()
        )
    );
}

#[test]
fn a_held_lock_is_a_typed_error_with_the_same_message() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("sub/j.sqlite");
    let _held = super::Lock::take(&p).unwrap();
    let e = super::Lock::take(&p).err().expect("the lock is held");
    assert!(matches!(e, super::JournalError::Busy { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "another bisync of this pair is running (lock {}.lock is held)",
            p.display()
        )
    );
    // A journal error refuses a bisync run, and the engine classifies the
    // refusal as it classifies a refused sync.
    let r: ferry_engine::Refused = e.into();
    let io = std::io::Error::other(r);
    assert!(matches!(
        ferry_engine::class::classify(&io),
        ferry_engine::class::Class::Refused
    ));
}

/// A side without inodes keeps its objects' versions in the identity
/// column, in the record format every journal has; they come back as
/// `Meta::version`, the other side's inodes as `Meta::ino`.
#[test]
fn versions_of_a_side_without_inodes_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("j.sqlite");
    let mut j = Journal::open(&p, ("/a", "s3://b/p")).unwrap();
    let (tx, rx) = mpsc::channel();
    let object = Meta {
        version: 0xfeed_f00d,
        ..m(Kind::File, 3, 1_500_000_000_123, 0)
    };
    let s = Synced {
        a: m(Kind::File, 3, 1_500_000_000_123, 7),
        b: object,
    };
    tx.send(Update::Put(b"f".to_vec(), s)).unwrap();
    drop(tx);
    j.write_from(rx).unwrap();
    let read = |j: &Journal| {
        let recs = Records::dir(j, b"").unwrap();
        let v: Vec<Synced> = recs.iter().map(|(_, s)| s).collect();
        v
    };
    j.set_sides([true, false]);
    assert_eq!(read(&j), vec![s]);
    // Read as if both sides had inodes: the same column, as an inode.
    j.set_sides([true; 2]);
    let raw = read(&j)[0];
    assert_eq!((raw.b.ino, raw.b.version), (0xfeed_f00d, 0));
}

/// Many updates in random order, in batches, in several directories
/// (chunks split and emptied): the journal holds exactly the model.
#[test]
fn chunks_follow_a_model() {
    use std::collections::BTreeMap;
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("j.sqlite");
    let j = Journal::open(&p, ("/a", "/b")).unwrap();
    let ps: i64 = j
        .conn
        .lock()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ps, 65536);
    let mut model: BTreeMap<Vec<u8>, Synced> = BTreeMap::new();
    let mut seed = 7u64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..6 {
        let (tx, rx) = mpsc::channel();
        for _ in 0..3000 {
            let dir = [&b""[..], b"d", b"d\0e", b"w"][rnd(4) as usize];
            let mut key = dir.to_vec();
            if !key.is_empty() {
                key.push(0);
            }
            key.extend_from_slice(format!("f{:05}", rnd(2000)).as_bytes());
            // Deletes dominate the last rounds, emptying chunks.
            if rnd(6) < 2 + round / 2 {
                model.remove(&key);
                tx.send(Update::Delete(key)).unwrap();
            } else {
                let s = Synced {
                    a: m(Kind::File, rnd(100), rnd(1 << 40) as i64, rnd(1000)),
                    b: m(Kind::File, rnd(100), rnd(1 << 40) as i64, rnd(1000)),
                };
                model.insert(key.clone(), s);
                tx.send(Update::Put(key, s)).unwrap();
            }
        }
        drop(tx);
        j.write_from(rx).unwrap();
        let l = j.load().unwrap();
        let got: Vec<(Vec<u8>, Synced)> = l.walk();
        let want: Vec<(Vec<u8>, Synced)> = model.iter().map(|(k, s)| (k.clone(), *s)).collect();
        assert_eq!(got.len(), want.len(), "round {round}");
        assert!(got == want, "round {round}");
        let max: i64 = j
            .conn
            .lock()
            .query_row("SELECT max(length(data)) FROM chunks", [], |r| r.get(0))
            .unwrap_or(0);
        assert!(
            max as usize <= CHUNK_MAX * (2 + 6 + REC),
            "chunk of {max} bytes"
        );
    }
}

/// A version 1 journal (one row per path) is migrated on open.
#[test]
fn version_1_is_migrated() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("j.sqlite");
    let s = Synced {
        a: m(Kind::File, 3, 1_500_000_000_123, 7),
        b: m(Kind::File, 3, 1_500_000_000_123, 9),
    };
    {
        let c = Connection::open(&p).unwrap();
        c.execute_batch(
            "CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
             CREATE TABLE entries (key BLOB PRIMARY KEY, rec BLOB NOT NULL) WITHOUT ROWID;
             INSERT INTO meta VALUES ('version', '1'), ('root_a', '/a'), ('root_b', '/b');",
        )
        .unwrap();
        for k in [&b"a"[..], b"a\0z", b"a.x", b"a\0b\0c"] {
            c.execute(
                "INSERT INTO entries VALUES (?1, ?2)",
                params![k, narrow(&s)],
            )
            .unwrap();
        }
    }
    let j = Journal::open(&p, ("/a", "/b")).unwrap();
    let keys: Vec<Vec<u8>> = j
        .load()
        .unwrap()
        .walk()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        keys,
        vec![
            b"a".to_vec(),
            b"a\0b\0c".to_vec(),
            b"a\0z".to_vec(),
            b"a.x".to_vec()
        ]
    );
    assert_eq!(j.load().unwrap().get(b"a\0z"), Some(unknown_ctimes(s)));
    drop(j);
    let j = Journal::open(&p, ("/a", "/b")).unwrap();
    assert_eq!(j.load().unwrap().len(), 4);
    let ps: i64 = j
        .conn
        .lock()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ps, 65536);
}

#[test]
fn lock_is_exclusive() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("j.sqlite");
    let l = Lock::take(&p).unwrap();
    assert!(Lock::take(&p).is_err());
    drop(l);
    Lock::take(&p).unwrap();
}

/// A version 2 journal (records without change times) is migrated on
/// open: every record kept, change times unknown (never compared) until
/// the path is synced again; records written afterwards carry them.
#[test]
fn version_2_is_migrated() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("j.sqlite");
    let s = Synced {
        a: m(Kind::File, 3, 1_500_000_000_123, 7),
        b: m(Kind::File, 3, 1_500_000_000_123, 9),
    };
    let names: Vec<Vec<u8>> = (0..1500).map(|i| format!("f{i:05}").into_bytes()).collect();
    {
        // A v2 journal: two chunks of the root, one of `d`.
        let j = Journal::open(&p, ("/a", "/b")).unwrap();
        let c = j.conn.lock();
        c.execute("UPDATE meta SET v = '2' WHERE k = 'version'", [])
            .unwrap();
        for (dir, part) in [
            (&b""[..], &names[..900]),
            (b"", &names[900..]),
            (b"d", &names[..3]),
        ] {
            let mut data = Vec::new();
            for n in part {
                data.extend_from_slice(&(n.len() as u16).to_le_bytes());
                data.extend_from_slice(n);
                data.extend_from_slice(&narrow(&s));
            }
            c.execute(
                "INSERT INTO chunks (dir, first, data) VALUES (?1, ?2, ?3)",
                params![dir, part[0], data],
            )
            .unwrap();
        }
    }
    let j = Journal::open(&p, ("/a", "/b")).unwrap();
    let l = j.load().unwrap();
    assert_eq!(l.len(), 1503);
    assert_eq!(l.get(b"f01499"), Some(unknown_ctimes(s)));
    assert_eq!(l.get(b"d\0f00002"), Some(unknown_ctimes(s)));
    let (tx, rx) = mpsc::channel();
    tx.send(Update::Put(b"f00007".to_vec(), s)).unwrap();
    drop(tx);
    j.write_from(rx).unwrap();
    drop(j);
    let j = Journal::open(&p, ("/a", "/b")).unwrap();
    let l = j.load().unwrap();
    assert_eq!(l.get(b"f00007"), Some(s));
    assert_eq!(l.len(), 1503);
}

/// A journal whose records cannot be read fails the walk's reads with a
/// typed error, said as before (`journal PATH: damaged record`), and
/// classified as every journal error is: the run is refused.
#[test]
fn a_damaged_record_is_a_typed_error_classified_as_a_refusal() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("j.sqlite");
    drop(Journal::open(&p, ("/a", "/b")).unwrap());
    // A chunk whose record is cut short, written behind the journal's back.
    let c = Connection::open(&p).unwrap();
    c.execute(
        "INSERT INTO chunks (dir, first, data) VALUES (x'', x'61', x'010061ff')",
        [],
    )
    .unwrap();
    drop(c);
    let j = Journal::open(&p, ("/a", "/b")).unwrap();
    let e = Records::dir(&j, b"").expect_err("a damaged record");
    assert!(matches!(e, JournalError::Damaged { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("journal {}: damaged record", p.display())
    );
    let e = Records::get(&j, b"", b"a").expect_err("a damaged record");
    assert!(matches!(e, JournalError::Damaged { .. }), "{e:?}");
    let r: ferry_engine::Refused = e.into();
    assert_eq!(r.0, format!("journal {}: damaged record", p.display()));
    let io = std::io::Error::other(r);
    assert_eq!(
        ferry_engine::class::classify(&io),
        ferry_engine::class::Class::Refused
    );
}
