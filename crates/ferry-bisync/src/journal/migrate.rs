//! Journals of older versions, migrated to chunks of version 3 on open.

use rusqlite::Connection;

use super::*;

/// Journal version 1 (one row per path in table `entries`) to chunks, in
/// the transaction that opens it.
pub(super) fn migrate_v1(conn: &Connection) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    let mut rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = Vec::new();
    {
        let mut st = tx.prepare("SELECT key, rec FROM entries")?;
        let mut q = st.query([])?;
        while let Some(r) = q.next()? {
            let key: Vec<u8> = r.get(0)?;
            let rec: Vec<u8> = r.get(1)?;
            rows.push((
                parent_key(&key).unwrap_or(b"").to_vec(),
                name_of(&key).to_vec(),
                widen(&rec),
            ));
        }
    }
    rewrite(&tx, rows)?;
    tx.execute_batch("DROP TABLE entries")?;
    tx.execute("UPDATE meta SET v = ?1 WHERE k = 'version'", [VERSION])?;
    tx.commit()?;
    // Rebuilt with 64 KiB pages (the page size of a WAL database only
    // changes outside WAL mode), which also returns the old table's pages.
    conn.execute_batch(
        "PRAGMA journal_mode=DELETE;
         PRAGMA page_size=65536;
         VACUUM;
         PRAGMA journal_mode=WAL;",
    )
}

/// A record of format 1 or 2 (no change time) in format 3: each side's
/// change time unknown (0: not compared, until the path is next synced).
/// A record of another length stays as it is (and is refused when read).
fn widen(rec: &[u8]) -> Vec<u8> {
    const OLD_SIDE: usize = SIDE - 8;
    if rec.len() != 1 + 2 * OLD_SIDE {
        return rec.to_vec();
    }
    let mut v = Vec::with_capacity(REC);
    v.push(rec[0]);
    for side in rec[1..].chunks(OLD_SIDE) {
        v.extend_from_slice(side);
        v.extend_from_slice(&0u64.to_le_bytes());
    }
    v
}

/// Format 2 → 3: every chunk's records widened (change times unknown).
pub(super) fn migrate_v2(conn: &Connection) -> rusqlite::Result<()> {
    const OLD_REC: usize = 1 + 2 * (SIDE - 8);
    let tx = conn.unchecked_transaction()?;
    let mut rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = Vec::new();
    {
        let mut st = tx.prepare("SELECT dir, data FROM chunks")?;
        let mut q = st.query([])?;
        while let Some(r) = q.next()? {
            let dir: Vec<u8> = r.get(0)?;
            let data: Vec<u8> = r.get(1)?;
            // A chunk cut short loses what follows (the next run sees
            // those paths as new on both sides: compared, never deleted).
            for (name, rec) in RecIter(&data, OLD_REC).map_while(|(n, r)| Some((n, r?))) {
                rows.push((dir.clone(), name.to_vec(), widen(rec)));
            }
        }
    }
    tx.execute("DELETE FROM chunks", [])?;
    rewrite(&tx, rows)?;
    tx.execute("UPDATE meta SET v = ?1 WHERE k = 'version'", [VERSION])?;
    tx.commit()
}

/// Write `rows` (dir, name, record) as chunks, by directory.
fn rewrite(
    tx: &rusqlite::Transaction<'_>,
    mut rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>,
) -> rusqlite::Result<()> {
    rows.sort();
    let mut i = 0;
    while i < rows.len() {
        let j = i + rows[i..].iter().take_while(|r| r.0 == rows[i].0).count();
        let recs: Recs = rows[i..j]
            .iter()
            .map(|r| (r.1.clone(), r.2.clone()))
            .collect();
        write_chunks(tx, &rows[i].0, &recs)?;
        i = j;
    }
    Ok(())
}
