//! The journal: an embedded SQLite file holding, per path, the state of
//! each side at the last sync ([`Synced`]).
//!
//! Records are stored by directory: a row holds a run of at most
//! `CHUNK_MAX` consecutive children (by name) of one directory, and at
//! most `ROW_BYTES` (no overflow pages), keyed by
//! the directory's key (its relative path with `/` written as NUL, a byte
//! no file name holds) and the run's first name. A walk reads a
//! directory's rows when it visits the directory ([`Records::dir`]: one
//! indexed range of a few rows per directory), so SQLite's per-row cost
//! is paid per chunk and memory holds only the directories in flight. An
//! update rewrites the chunk that holds its name (once per transaction,
//! however many of the transaction's updates fall in it).
//!
//! Rows are only written after the action they describe is complete, in
//! small transactions (see [`Journal::write_from`]): a run killed at any
//! moment leaves a journal that is at worst stale, never ahead of the
//! replicas. A stale row makes the next run see a change on a side where
//! there is none (an extra copy, or a conflict where both sides moved on),
//! never a deletion.
//!
//! Migrations of older journals: `journal/migrate.rs`; the default path
//! and the lock of a pair: `journal/lock.rs`; tests: `journal/tests.rs`.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use ferry_engine::{Kind, Meta};
use rusqlite::{params, Connection, OptionalExtension};

use crate::reconcile::Synced;
use crate::tree::{name_of, parent_key};

/// Schema version stored in the `meta` table (1: one row per path; 2:
/// records without the change time; both migrated on open).
const VERSION: &str = "3";

/// Records per chunk row at most; a fuller chunk is split in halves.
const CHUNK_MAX: usize = 512;

/// A row's bytes at most (key and records): what a 64 KiB page of an
/// index b-tree (a WITHOUT ROWID table) holds without an overflow page.
const ROW_BYTES: usize = 16_000;

/// An open journal. Its connection is shared by the walk's workers, each
/// reading the records of the directory it visits, and the writer.
pub struct Journal {
    conn: Mutex<Connection>,
    path: PathBuf,
    /// Per side: the identity column holds object versions, not inodes.
    versions: [bool; 2],
}

/// A change to the journal, sent by the executor once an action is done.
#[derive(Debug)]
pub enum Update {
    /// The path is in sync with these states.
    Put(Vec<u8>, Synced),
    /// The path is gone on both sides.
    Delete(Vec<u8>),
    /// Children of one directory (its key) found in sync by a first run,
    /// as (name, states), written together.
    Dir(Vec<u8>, Vec<(Vec<u8>, Synced)>),
}

/// Rows per transaction at most: a kill loses at most this many records
/// (which only costs the next run some comparisons).
const BATCH: usize = 512;

fn kind_code(k: Kind) -> i64 {
    match k {
        Kind::File => 0,
        Kind::Dir => 1,
        Kind::Symlink => 2,
        // Special files are never recorded (bisync skips them).
        _ => 3,
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

fn meta(kind: Kind, size: i64, mtime_ns: i64, mode: i64, ino: i64, ctime: u64) -> Meta {
    Meta {
        kind,
        size: size as u64,
        mtime_sec: mtime_ns.div_euclid(1_000_000_000),
        mtime_nsec: mtime_ns.rem_euclid(1_000_000_000) as u32,
        mode: mode as u32,
        uid: 0,
        gid: 0,
        ino: ino as u64,
        version: 0,
        rdev: 0,
        sparse: false,
        nlink: 0,
        dev: 0,
        ctime,
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
    pub fn open(path: &Path, roots: (&str, &str)) -> Result<Journal, JournalError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|source| JournalError::Dir {
                    dir: dir.to_path_buf(),
                    source,
                })?;
            }
        }
        let err = |source| JournalError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(err)?;
        // WAL: a commit is one append; synchronous=NORMAL can lose the last
        // transactions on power loss, which only makes the journal stale.
        // Exclusive locking (our own flock already keeps other runs out)
        // keeps the WAL index in memory: no -shm file to map and initialise.
        // 64 KiB pages (set before the first table exists): a chunk of
        // records takes one page and at most one overflow page instead of a
        // chain of small ones. Pages are read into SQLite's own bounded
        // cache, not mapped: the mapped pages of a journal read in full
        // would stay in the process's memory. The index on `dir` alone lists the
        // directories holding records without reading the records.
        conn.execute_batch(
            "PRAGMA page_size=65536;
             PRAGMA locking_mode=EXCLUSIVE;
             PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS chunks (
                 dir BLOB NOT NULL,
                 first BLOB NOT NULL,
                 data BLOB NOT NULL,
                 PRIMARY KEY (dir, first)
             ) WITHOUT ROWID;
             CREATE INDEX IF NOT EXISTS chunks_dir ON chunks (dir);",
        )
        .map_err(err)?;
        let get = |k: &str| -> Result<Option<String>, JournalError> {
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
            (Some(v), _, _) if v == "1" => migrate_v1(&conn).map_err(err)?,
            (Some(v), _, _) if v == "2" => migrate_v2(&conn).map_err(err)?,
            (Some(v), _, _) if v != VERSION => {
                return Err(JournalError::Version {
                    path: path.to_path_buf(),
                    found: v,
                    reads: VERSION,
                })
            }
            (Some(_), Some(a), Some(b)) if (a.as_str(), b.as_str()) != roots => {
                return Err(JournalError::OtherPair {
                    path: path.to_path_buf(),
                    theirs: (a, b),
                    ours: (roots.0.to_string(), roots.1.to_string()),
                })
            }
            _ => {}
        }
        Ok(Journal {
            conn: Mutex::new(conn),
            path: path.to_path_buf(),
            versions: [false; 2],
        })
    }

    /// Where the journal lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record (tests).
    #[cfg(test)]
    pub fn load(&self) -> Result<Snapshot, JournalError> {
        let mut dirs = Vec::new();
        self.each_dir(&mut |d| dirs.push(d.to_vec()))?;
        let mut v = Vec::new();
        for d in dirs {
            for (n, s) in self.dir(&d)?.iter() {
                let mut k = d.clone();
                if !k.is_empty() {
                    k.push(0);
                }
                k.extend_from_slice(n);
                v.push((k, s));
            }
        }
        Ok(Snapshot::from_keys(v))
    }

    /// True when a run of this pair has started with this journal (or it
    /// holds records, as one written by an older ferry does): the pair has
    /// been synced, so its roots have been seen. A journal file that only
    /// exists (created by a refused run, or just now) says nothing.
    pub fn knows_pair(&self) -> Result<bool, JournalError> {
        let err = |e| self.sqlite(e);
        let conn = self.conn.lock();
        if synced_mark(&conn).map_err(err)? {
            return Ok(true);
        }
        let any: Option<i64> = conn
            .query_row("SELECT 1 FROM chunks LIMIT 1", [], |r| r.get(0))
            .optional()
            .map_err(err)?;
        Ok(any.is_some())
    }

    /// Record that a run of this pair goes ahead (before its first action):
    /// from now on [`Journal::knows_pair`] is true.
    /// Writes nothing when the mark is there (a no-op run writes nothing).
    pub fn mark_synced(&mut self) -> Result<(), JournalError> {
        let path = &self.path;
        let err = |source| JournalError::Sqlite {
            path: path.clone(),
            source,
        };
        let conn = self.conn.get_mut();
        if !synced_mark(conn).map_err(err)? {
            conn.execute("INSERT INTO meta (k, v) VALUES ('synced', '1')", [])
                .map_err(err)?;
        }
        Ok(())
    }

    /// Forget every record (`--resync`), in one transaction.
    pub fn clear(&mut self) -> Result<(), JournalError> {
        self.conn
            .get_mut()
            .execute("DELETE FROM chunks", [])
            .map(|_| ())
            .map_err(|source| JournalError::Sqlite {
                path: self.path.clone(),
                source,
            })
    }

    /// `e` as an error of this journal.
    fn sqlite(&self, source: rusqlite::Error) -> JournalError {
        JournalError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Apply updates as they arrive on `rx` until every sender is gone:
    /// each transaction takes what is waiting (at most `BATCH` rows, or
    /// one directory's [`Update::Dir`]), so records trail the work by one
    /// batch at most and no timer is needed.
    pub fn write_from(&self, rx: mpsc::Receiver<Update>) -> Result<u64, JournalError> {
        let err = |e| self.sqlite(e);
        let mut n = 0u64;
        while let Ok(first) = rx.recv() {
            // What is waiting, by directory then name; the last update of
            // a path wins.
            let mut by_dir: BTreeMap<Vec<u8>, DirUpdates> = BTreeMap::new();
            let mut next = Some(first);
            let mut in_tx = 0;
            while let Some(u) = next.take() {
                let (key, rec) = match u {
                    Update::Put(key, s) => (key, Some(pack(&s))),
                    Update::Delete(key) => (key, None),
                    Update::Dir(dir, recs) => {
                        let ups = by_dir.entry(dir).or_default();
                        n += recs.len() as u64;
                        in_tx += recs.len();
                        for (name, s) in recs {
                            ups.insert(name, Some(pack(&s)));
                        }
                        if in_tx < BATCH {
                            next = rx.try_recv().ok();
                        }
                        continue;
                    }
                };
                let dir = parent_key(&key).unwrap_or(b"").to_vec();
                by_dir
                    .entry(dir)
                    .or_default()
                    .insert(name_of(&key).to_vec(), rec);
                n += 1;
                in_tx += 1;
                if in_tx < BATCH {
                    next = rx.try_recv().ok();
                }
            }
            let mut conn = self.conn.lock();
            let tx = conn.transaction().map_err(err)?;
            for (dir, ups) in by_dir {
                apply(&tx, &dir, ups).map_err(err)?;
            }
            tx.commit().map_err(err)?;
        }
        Ok(n)
    }
}

/// Where a walk gets the journal's records: a directory's at a time, when
/// the walk visits it, so memory holds the directories in flight.
pub trait Records: Sync {
    /// The records of directory `dir`'s children (`dir` a key), names rising.
    fn dir(&self, dir: &[u8]) -> Result<DirRecs, JournalError>;
    /// Call `f` with the key of every directory holding records, in key
    /// order (to find records below directories no walk reaches).
    fn each_dir(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), JournalError>;
    /// The record of the child `name` of directory `dir` (a key), if any
    /// (a scoped run checks the directories on its way from the root).
    fn get(&self, dir: &[u8], name: &[u8]) -> Result<Option<Synced>, JournalError> {
        let recs = self.dir(dir)?;
        let found = recs.iter().find(|(n, _)| *n == name).map(|(_, s)| s);
        Ok(found)
    }
}

/// No journal (a first run, `--resync`): no records.
pub struct NoRecords;

impl Records for NoRecords {
    fn dir(&self, _: &[u8]) -> Result<DirRecs, JournalError> {
        Ok(DirRecs::default())
    }
    fn each_dir(&self, _: &mut dyn FnMut(&[u8])) -> Result<(), JournalError> {
        Ok(())
    }
}

/// One directory's records as stored (name length, name, packed record;
/// names rising), decoded as the merge walks them: a no-op run touches
/// each record once.
#[derive(Debug, Default)]
pub struct DirRecs {
    data: Vec<u8>,
    /// Per side: the identity column is `Meta::version`, not `Meta::ino`.
    versions: [bool; 2],
    /// Where the last name sits in `data`.
    last: Option<(usize, usize)>,
    len: usize,
    files: u64,
}

impl DirRecs {
    /// Append one chunk, checked: whole records, names rising.
    fn push_chunk(&mut self, chunk: &[u8]) -> Option<()> {
        let start = self.data.len();
        self.data.extend_from_slice(chunk);
        let d = &self.data[..];
        let mut prev = self.last;
        let mut at = start;
        while at < d.len() {
            let n = u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?) as usize;
            let (name, rec) = (at + 2, at + 2 + n);
            if rec + REC > d.len() || d[rec] > 3 {
                return None;
            }
            if let Some((o, l)) = prev {
                if d[o..o + l] >= d[name..rec] {
                    return None;
                }
            }
            prev = Some((name, n));
            self.len += 1;
            self.files += (d[rec] != 1) as u64;
            at = rec + REC;
        }
        self.last = prev;
        Some(())
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records of files and symlinks (not directories).
    pub fn files(&self) -> u64 {
        self.files
    }

    /// The records, in name order: (name, record).
    /// A side without inodes gets the identity column as `Meta::version`.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Synced)> {
        let versions = self.versions;
        let side = move |m: &mut Meta, version: bool| {
            if version {
                (m.version, m.ino) = (m.ino, 0);
            }
        };
        RecIter(&self.data, REC).map(move |(n, r)| {
            let mut rec = unpack(r.expect("checked")).expect("checked");
            side(&mut rec.a, versions[0]);
            side(&mut rec.b, versions[1]);
            (n, rec)
        })
    }
}

impl Journal {
    /// Tell which sides have inodes: on a side without, the identity
    /// column of a record holds the object's version (`Meta::version`).
    pub fn set_sides(&mut self, inodes: [bool; 2]) {
        self.versions = [!inodes[0], !inodes[1]];
    }
}

impl Records for Journal {
    fn dir(&self, dir: &[u8]) -> Result<DirRecs, JournalError> {
        let mut out = DirRecs {
            versions: self.versions,
            ..DirRecs::default()
        };
        self.blobs(
            "SELECT data FROM chunks WHERE dir = ?1 ORDER BY first",
            &[&dir],
            &mut |data| out.push_chunk(data),
        )?;
        Ok(out)
    }

    fn each_dir(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), JournalError> {
        self.blobs(
            "SELECT DISTINCT dir FROM chunks INDEXED BY chunks_dir ORDER BY dir",
            &[],
            &mut |d| {
                f(d);
                Some(())
            },
        )
    }

    /// One indexed read: the chunk that would hold `name`.
    fn get(&self, dir: &[u8], name: &[u8]) -> Result<Option<Synced>, JournalError> {
        let mut out = DirRecs {
            versions: self.versions,
            ..DirRecs::default()
        };
        self.blobs(
            "SELECT data FROM chunks WHERE dir = ?1 AND first <= ?2 ORDER BY first DESC LIMIT 1",
            &[&dir, &name],
            &mut |data| out.push_chunk(data),
        )?;
        let found = out.iter().find(|(n, _)| *n == name).map(|(_, s)| s);
        Ok(found)
    }
}

impl Journal {
    /// Records of files and symlinks in the whole journal (the base of the
    /// deletion limit of a scoped run, which reads only some directories).
    pub fn count_files(&self) -> Result<u64, JournalError> {
        let mut n = 0;
        self.blobs("SELECT data FROM chunks", &[], &mut |data| {
            let mut d = DirRecs::default();
            d.push_chunk(data)?;
            n += d.files();
            Some(())
        })?;
        Ok(n)
    }
}

impl Journal {
    /// Run `sql` and hand the first column of each row (a blob) to `f`;
    /// `f` returning `None`, or a column that is no blob, is a damaged
    /// journal.
    fn blobs(
        &self,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
        f: &mut dyn FnMut(&[u8]) -> Option<()>,
    ) -> Result<(), JournalError> {
        let bad = || JournalError::Damaged {
            path: self.path.clone(),
        };
        let err = |e| self.sqlite(e);
        let conn = self.conn.lock();
        let mut st = conn.prepare_cached(sql).map_err(err)?;
        let mut rows = st.query(args).map_err(err)?;
        while let Some(r) = rows.next().map_err(err)? {
            let b = r.get_ref(0).map_err(err)?.as_blob().map_err(|_| bad())?;
            f(b).ok_or_else(bad)?;
        }
        Ok(())
    }
}

/// Whether the journal holds the mark of a run that went ahead.
fn synced_mark(conn: &Connection) -> rusqlite::Result<bool> {
    let marked: Option<String> = conn
        .query_row("SELECT v FROM meta WHERE k = 'synced'", [], |r| r.get(0))
        .optional()?;
    Ok(marked.is_some())
}

/// A journal held in memory, for tests: records by directory.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct Snapshot {
    dirs: BTreeMap<Vec<u8>, DirRecs>,
}

#[cfg(test)]
impl Records for Snapshot {
    fn dir(&self, dir: &[u8]) -> Result<DirRecs, JournalError> {
        Ok(self
            .dirs
            .get(dir)
            .map_or_else(DirRecs::default, |d| DirRecs {
                data: d.data.clone(),
                last: d.last,
                len: d.len,
                files: d.files,
                versions: d.versions,
            }))
    }
    fn each_dir(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), JournalError> {
        self.dirs.keys().for_each(|k| f(k));
        Ok(())
    }
}

#[cfg(test)]
impl Snapshot {
    /// Records given by key, in any order.
    pub fn from_keys(mut v: Vec<(Vec<u8>, Synced)>) -> Snapshot {
        let split = |k: &[u8]| (parent_key(k).unwrap_or(b"").to_vec(), name_of(k).to_vec());
        v.sort_by_key(|x| split(&x.0));
        let mut out = Snapshot::default();
        for (k, s) in v {
            let name = name_of(&k);
            let mut chunk = (name.len() as u16).to_le_bytes().to_vec();
            chunk.extend_from_slice(name);
            chunk.extend_from_slice(&pack(&s));
            out.dirs
                .entry(parent_key(&k).unwrap_or(b"").to_vec())
                .or_default()
                .push_chunk(&chunk)
                .expect("distinct keys");
        }
        out
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.dirs.values().map(|d| d.len).sum()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records of files and symlinks.
    pub fn files(&self) -> u64 {
        self.dirs.values().map(|d| d.files).sum()
    }

    /// The record at `key`.
    pub fn get(&self, key: &[u8]) -> Option<Synced> {
        let name = name_of(key);
        self.dirs
            .get(parent_key(key).unwrap_or(b""))?
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s)
    }

    /// Every record as (key, record), in key order.
    pub fn walk(&self) -> Vec<(Vec<u8>, Synced)> {
        let mut out = Vec::new();
        for (dir, recs) in &self.dirs {
            for (name, s) in recs.iter() {
                let mut key = dir.clone();
                if !key.is_empty() {
                    key.push(0);
                }
                key.extend_from_slice(name);
                out.push((key, s));
            }
        }
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    }
}

/// One directory's updates in a transaction: name → packed record, or
/// `None` to delete.
type DirUpdates = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// One chunk's records, decoded: (name, packed record).
type Recs = Vec<(Vec<u8>, Vec<u8>)>;

/// Apply one transaction's updates of directory `dir` (by name): each
/// chunk they fall in is read, changed and written back once.
fn apply(tx: &rusqlite::Transaction<'_>, dir: &[u8], ups: DirUpdates) -> rusqlite::Result<()> {
    let mut floor = tx.prepare_cached(
        "SELECT first, data FROM chunks WHERE dir = ?1 AND first <= ?2 ORDER BY first DESC LIMIT 1",
    )?;
    let mut lowest =
        tx.prepare_cached("SELECT first, data FROM chunks WHERE dir = ?1 ORDER BY first LIMIT 1")?;
    let mut after = tx.prepare_cached(
        "SELECT first FROM chunks WHERE dir = ?1 AND first > ?2 ORDER BY first LIMIT 1",
    )?;
    let mut del = tx.prepare_cached("DELETE FROM chunks WHERE dir = ?1 AND first = ?2")?;
    let row = |r: &rusqlite::Row<'_>| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?));
    let mut ups = ups.into_iter().peekable();
    while let Some((name, _)) = ups.peek() {
        // The chunk holding `name`: the last one starting at or before it,
        // else the first one (the name then goes before all of them).
        let cur = match floor.query_row(params![dir, name], row).optional()? {
            Some(c) => Some(c),
            None => lowest.query_row(params![dir], row).optional()?,
        };
        let bound: Option<Vec<u8>> = match &cur {
            Some((f, _)) => after.query_row(params![dir, f], |r| r.get(0)).optional()?,
            None => None,
        };
        let mut recs: Recs = match &cur {
            Some((_, data)) => RecIter(data, REC)
                .map(|(n, r)| (n.to_vec(), r.unwrap_or_default().to_vec()))
                .collect(),
            None => Vec::new(),
        };
        while let Some((name, _)) = ups.peek() {
            if bound.as_deref().is_some_and(|b| name.as_slice() >= b) {
                break;
            }
            let (name, rec) = ups.next().expect("peeked");
            match (recs.binary_search_by(|(n, _)| n.cmp(&name)), rec) {
                (Ok(i), Some(r)) => recs[i].1 = r,
                (Err(i), Some(r)) => recs.insert(i, (name, r)),
                (Ok(i), None) => {
                    recs.remove(i);
                }
                (Err(_), None) => {}
            }
        }
        if let Some((f, _)) = &cur {
            del.execute(params![dir, f])?;
        }
        write_chunks(tx, dir, &recs)?;
    }
    Ok(())
}

/// Store a directory's run of records (in name order) as chunk rows.
fn write_chunks(
    tx: &rusqlite::Transaction<'_>,
    dir: &[u8],
    recs: &[(Vec<u8>, Vec<u8>)],
) -> rusqlite::Result<()> {
    if recs.is_empty() {
        return Ok(());
    }
    let mut ins = tx.prepare_cached("INSERT INTO chunks (dir, first, data) VALUES (?1, ?2, ?3)")?;
    // One row when all fit, else rows half full: room for later inserts.
    let size = |(n, r): &(Vec<u8>, Vec<u8>)| 2 + n.len() + r.len();
    let room = ROW_BYTES
        .saturating_sub(dir.len() + 2 * 255)
        .max(ROW_BYTES / 8);
    let total: usize = recs.iter().map(size).sum();
    let (per, bytes) = if recs.len() <= CHUNK_MAX && total <= room {
        (CHUNK_MAX, room)
    } else {
        (CHUNK_MAX / 2, room / 2)
    };
    let mut part = 0;
    while part < recs.len() {
        let mut end = part;
        let mut len = 0;
        while end < recs.len()
            && end - part < per
            && (end == part || len + size(&recs[end]) <= bytes)
        {
            len += size(&recs[end]);
            end += 1;
        }
        let mut data = Vec::with_capacity(len);
        for (n, r) in &recs[part..end] {
            data.extend_from_slice(&(n.len() as u16).to_le_bytes());
            data.extend_from_slice(n);
            data.extend_from_slice(r);
        }
        ins.execute(params![dir, recs[part].0, data])?;
        part = end;
    }
    Ok(())
}

/// The records of a chunk's data: (name, packed record of the given
/// length), the record `None` when the data is cut short.
struct RecIter<'a>(&'a [u8], usize);

impl<'a> Iterator for RecIter<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        let d = self.0;
        if d.len() < 2 {
            return None;
        }
        let n = u16::from_le_bytes([d[0], d[1]]) as usize;
        let end = 2 + n + self.1;
        if d.len() < end {
            self.0 = &[];
            return Some((&d[2.min(d.len())..(2 + n).min(d.len())], None));
        }
        self.0 = &d[end..];
        Some((&d[2..2 + n], Some(&d[2 + n..end])))
    }
}

/// Bytes of one side in a record: size, mtime (ns), mode, identity (the
/// inode, or on a store without inodes the object's version: a store sets
/// at most one of them), change time (`Meta::ctime`, 0 where unknown).
const SIDE: usize = 8 + 8 + 4 + 8 + 8;

/// Bytes of a packed record: kind, then both sides.
const REC: usize = 1 + 2 * SIDE;

/// A record as one blob (kind, then each side's fields, little-endian):
/// one column to read per row instead of nine.
fn pack(s: &Synced) -> Vec<u8> {
    let mut v = Vec::with_capacity(REC);
    v.push(kind_code(s.a.kind) as u8);
    for m in [&s.a, &s.b] {
        v.extend_from_slice(&m.size.to_le_bytes());
        v.extend_from_slice(&mtime_ns(m).to_le_bytes());
        v.extend_from_slice(&m.mode.to_le_bytes());
        let id = if m.ino != 0 { m.ino } else { m.version };
        v.extend_from_slice(&id.to_le_bytes());
        v.extend_from_slice(&m.ctime.to_le_bytes());
    }
    v
}

fn unpack(b: &[u8]) -> Option<Synced> {
    if b.len() != REC {
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
            u64::from_le_bytes(u(28, 8).try_into().unwrap()),
        )
    };
    Some(Synced {
        a: side(1),
        b: side(1 + SIDE),
    })
}

mod error;
mod lock;
mod migrate;

pub use error::JournalError;
pub use lock::{default_path, Lock};
use migrate::{migrate_v1, migrate_v2};

#[cfg(test)]
mod tests;
