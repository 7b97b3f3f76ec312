//! The journal: an embedded SQLite file holding, per path, the state of
//! each side at the last sync ([`Synced`]).
//!
//! One row per path in a `WITHOUT ROWID` table keyed by the path, with `/`
//! written as NUL (a byte no file name holds): byte order of keys is then
//! the order of a depth-first walk with names sorted, the order in which
//! scans are assembled, so loading is one ordered table scan with one
//! prepared statement and the three-way merge needs no sort.
//!
//! Rows are only written after the action they describe is complete, in
//! small transactions (see [`Writer`]): a run killed at any moment leaves
//! a journal that is at worst stale, never ahead of the replicas. A stale
//! row makes the next run see a change on a side where there is none (an
//! extra copy, or a conflict where both sides moved on), never a deletion.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use ferry_engine::{Kind, Meta};
use rusqlite::{params, Connection, OptionalExtension};

use crate::reconcile::Synced;
use crate::tree::Keyed;

/// Schema version stored in the `meta` table.
const VERSION: &str = "1";

/// An open journal.
pub struct Journal {
    conn: Connection,
    path: PathBuf,
}

/// A change to the journal, sent by the executor once an action is done.
#[derive(Debug)]
pub enum Update {
    /// The path is in sync with these states.
    Put(Vec<u8>, Synced),
    /// The path is gone on both sides.
    Delete(Vec<u8>),
}

/// Rows per transaction at most: a kill loses at most this many records
/// (which only costs the next run some comparisons).
const BATCH: usize = 512;

fn kind_code(k: Kind) -> i64 {
    match k {
        Kind::File => 0,
        Kind::Dir => 1,
        Kind::Symlink => 2,
        Kind::Other => 3,
    }
}

fn kind_of(c: i64) -> Kind {
    match c {
        0 => Kind::File,
        1 => Kind::Dir,
        2 => Kind::Symlink,
        _ => Kind::Other,
    }
}

fn meta(kind: Kind, size: i64, mtime_ns: i64, mode: i64, ino: i64) -> Meta {
    Meta {
        kind,
        size: size as u64,
        mtime_sec: mtime_ns.div_euclid(1_000_000_000),
        mtime_nsec: mtime_ns.rem_euclid(1_000_000_000) as u32,
        mode: mode as u32,
        uid: 0,
        gid: 0,
        ino: ino as u64,
    }
}

fn mtime_ns(m: &Meta) -> i64 {
    m.mtime_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(m.mtime_nsec as i64)
}

impl Journal {
    /// Open (or create) the journal at `path` for the pair of roots
    /// `roots` (a journal made for another pair is refused).
    pub fn open(path: &Path, roots: (&str, &str)) -> Result<Journal, String> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("journal directory {}: {e}", dir.display()))?;
            }
        }
        let err = |e: rusqlite::Error| format!("journal {}: {e}", path.display());
        let conn = Connection::open(path).map_err(err)?;
        // WAL: a commit is one append; synchronous=NORMAL can lose the last
        // transactions on power loss, which only makes the journal stale.
        // Exclusive locking (our own flock already keeps other runs out)
        // keeps the WAL index in memory: no -shm file to map and initialise.
        conn.execute_batch(
            "PRAGMA locking_mode=EXCLUSIVE;
             PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             PRAGMA mmap_size=1073741824;
             CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS entries (
                 key BLOB PRIMARY KEY,
                 rec BLOB NOT NULL
             ) WITHOUT ROWID;",
        )
        .map_err(err)?;
        let get = |k: &str| -> Result<Option<String>, String> {
            conn.query_row("SELECT v FROM meta WHERE k = ?1", [k], |r| r.get(0))
                .optional()
                .map_err(err)
        };
        match (get("version")?, get("root_a")?, get("root_b")?) {
            (None, _, _) => {
                conn.execute(
                    "INSERT OR REPLACE INTO meta (k, v) VALUES ('version', ?1), ('root_a', ?2), ('root_b', ?3)",
                    params![VERSION, roots.0, roots.1],
                )
                .map_err(err)?;
            }
            (Some(v), _, _) if v != VERSION => {
                return Err(format!(
                    "journal {}: version {v}, this ferry reads version {VERSION}",
                    path.display()
                ))
            }
            (Some(_), Some(a), Some(b)) if (a.as_str(), b.as_str()) != roots => {
                return Err(format!(
                    "journal {} belongs to {a} and {b}, not to {} and {}",
                    path.display(),
                    roots.0,
                    roots.1
                ))
            }
            _ => {}
        }
        Ok(Journal {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Where the journal lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record, in key order.
    pub fn load(&self) -> Result<Keyed<Synced>, String> {
        let err = |e: rusqlite::Error| format!("journal {}: {e}", self.path.display());
        let mut st = self
            .conn
            .prepare("SELECT key, rec FROM entries ORDER BY key")
            .map_err(err)?;
        let mut out = Keyed::default();
        let mut rows = st.query([]).map_err(err)?;
        while let Some(r) = rows.next().map_err(err)? {
            let key = r
                .get_ref(0)
                .map_err(err)?
                .as_blob()
                .map_err(|e| format!("journal {}: {e}", self.path.display()))?;
            let rec = r
                .get_ref(1)
                .map_err(err)?
                .as_blob()
                .map_err(|e| format!("journal {}: {e}", self.path.display()))?;
            let s = unpack(rec)
                .ok_or_else(|| format!("journal {}: damaged record", self.path.display()))?;
            out.push(key, s);
        }
        Ok(out)
    }

    /// Forget every record (`--resync`), in one transaction.
    pub fn clear(&mut self) -> Result<(), String> {
        self.conn
            .execute("DELETE FROM entries", [])
            .map(|_| ())
            .map_err(|e| format!("journal {}: {e}", self.path.display()))
    }

    /// Apply updates as they arrive on `rx` until every sender is gone:
    /// each transaction takes what is waiting (at most [`BATCH`] rows), so
    /// records trail the work by one batch at most and no timer is needed.
    pub fn write_from(&mut self, rx: mpsc::Receiver<Update>) -> Result<u64, String> {
        let path = self.path.clone();
        let err = |e: rusqlite::Error| format!("journal {}: {e}", path.display());
        let mut n = 0u64;
        while let Ok(first) = rx.recv() {
            let tx = self.conn.transaction().map_err(err)?;
            {
                let mut put = tx
                    .prepare_cached("INSERT OR REPLACE INTO entries (key, rec) VALUES (?1, ?2)")
                    .map_err(err)?;
                let mut del = tx
                    .prepare_cached("DELETE FROM entries WHERE key = ?1")
                    .map_err(err)?;
                let mut next = Some(first);
                let mut in_tx = 0;
                while let Some(u) = next.take() {
                    match u {
                        Update::Put(key, s) => {
                            put.execute(params![key, pack(&s)]).map_err(err)?;
                        }
                        Update::Delete(key) => {
                            del.execute(params![key]).map_err(err)?;
                        }
                    }
                    n += 1;
                    in_tx += 1;
                    if in_tx < BATCH {
                        next = rx.try_recv().ok();
                    }
                }
            }
            tx.commit().map_err(err)?;
        }
        Ok(n)
    }
}

/// Bytes of one side in a record: size, mtime (ns), mode, inode.
const SIDE: usize = 8 + 8 + 4 + 8;

/// A record as one blob (kind, then each side's fields, little-endian):
/// one column to read per row instead of nine.
fn pack(s: &Synced) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + 2 * SIDE);
    v.push(kind_code(s.a.kind) as u8);
    for m in [&s.a, &s.b] {
        v.extend_from_slice(&m.size.to_le_bytes());
        v.extend_from_slice(&mtime_ns(m).to_le_bytes());
        v.extend_from_slice(&m.mode.to_le_bytes());
        v.extend_from_slice(&m.ino.to_le_bytes());
    }
    v
}

fn unpack(b: &[u8]) -> Option<Synced> {
    if b.len() != 1 + 2 * SIDE {
        return None;
    }
    let kind = kind_of(b[0] as i64);
    let side = |o: usize| {
        let u = |i: usize, n: usize| &b[o + i..o + i + n];
        meta(
            kind,
            u64::from_le_bytes(u(0, 8).try_into().unwrap()) as i64,
            i64::from_le_bytes(u(8, 8).try_into().unwrap()),
            u32::from_le_bytes(u(16, 4).try_into().unwrap()) as i64,
            u64::from_le_bytes(u(20, 8).try_into().unwrap()) as i64,
        )
    };
    Some(Synced {
        a: side(1),
        b: side(1 + SIDE),
    })
}

/// The default journal file of a pair of roots:
/// `$XDG_STATE_HOME/ferry/bisync/<hash>.sqlite` (`~/.local/state` when
/// `XDG_STATE_HOME` is unset), `<hash>` a 64-bit FNV-1a of both roots.
pub fn default_path(roots: (&str, &str)) -> Result<PathBuf, String> {
    let base = match std::env::var_os("XDG_STATE_HOME") {
        Some(s) if !s.is_empty() => PathBuf::from(s),
        _ => match std::env::var_os("HOME") {
            Some(h) if !h.is_empty() => PathBuf::from(h).join(".local/state"),
            _ => return Err("neither XDG_STATE_HOME nor HOME is set: give --journal PATH".into()),
        },
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in roots
        .0
        .bytes()
        .chain(std::iter::once(0))
        .chain(roots.1.bytes())
    {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Ok(base.join("ferry/bisync").join(format!("{h:016x}.sqlite")))
}

/// An exclusive lock on `<journal>.lock`, held while a bisync of the pair
/// runs (released when dropped, or by the kernel when the process dies).
pub struct Lock {
    _fd: std::os::fd::OwnedFd,
}

impl Lock {
    /// Take the lock, or fail at once if another run holds it.
    pub fn take(journal: &Path) -> Result<Lock, String> {
        use rustix::fs::{flock, open, FlockOperation, Mode, OFlags};
        if let Some(dir) = journal.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("journal directory {}: {e}", dir.display()))?;
        }
        let mut p = journal.as_os_str().to_owned();
        p.push(".lock");
        let p = PathBuf::from(p);
        let fd = open(
            &p,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| format!("{}: {e}", p.display()))?;
        flock(&fd, FlockOperation::NonBlockingLockExclusive).map_err(|_| {
            format!(
                "another bisync of this pair is running (lock {} is held)",
                p.display()
            )
        })?;
        Ok(Lock { _fd: fd })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(kind: Kind, size: u64, ns: i64, ino: u64) -> Meta {
        meta(kind, size as i64, ns, 0o644, ino as i64)
    }

    #[test]
    fn round_trip_in_key_order() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j.sqlite");
        let mut j = Journal::open(&p, ("/a", "/b")).unwrap();
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
        let keys: Vec<&[u8]> = (0..l.len()).map(|i| l.key(i)).collect();
        assert_eq!(keys, vec![&b"a"[..], b"a\0z", b"a.x"]);
        assert_eq!(*l.value(0), s);
        drop(j);
        let e = Journal::open(&p, ("/a", "/c"))
            .err()
            .expect("another pair is refused");
        assert!(e.contains("belongs to /a and /b"), "{e}");
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
}
