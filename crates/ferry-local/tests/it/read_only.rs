//! A store that only reads leaves the rollback records a killed run left;
//! one that writes, in the same process, rolls them back (the setting is
//! the store's, no longer the process's).

use ferry_engine::entry::Listing;
use ferry_engine::store::{undo_name, Store};
use ferry_local::LocalStore;

fn list(s: &LocalStore) -> Vec<Vec<u8>> {
    let (d, _) = s.open_root().unwrap().expect("root");
    let mut out = Listing::default();
    let mut errors = Vec::new();
    s.list(&d, b"", &mut out, &mut errors).unwrap();
    assert!(errors.is_empty());
    out.entries().iter().map(|e| out.name(e).to_vec()).collect()
}

#[test]
fn a_read_only_store_leaves_rollback_records_a_writing_one_removes_them() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("f"), b"data").unwrap();
    let rec = t
        .path()
        .join(std::str::from_utf8(undo_name(b"f").to_bytes()).unwrap());
    // A torn record (never complete): nothing to restore, removed by a
    // store that writes.
    std::fs::write(&rec, b"torn").unwrap();

    let ro = LocalStore::new(t.path(), 1).read_only(true);
    assert!(ro.is_read_only());
    assert_eq!(list(&ro), vec![b"f".to_vec()], "the record is hidden");
    assert!(rec.exists(), "a read-only store left the record");

    let rw = LocalStore::new(t.path(), 1);
    assert!(!rw.is_read_only());
    assert_eq!(list(&rw), vec![b"f".to_vec()]);
    assert!(!rec.exists(), "a writing store removed the torn record");

    // Told later (as `ferry serve` is by its client).
    std::fs::write(&rec, b"torn").unwrap();
    rw.set_read_only();
    assert_eq!(list(&rw), vec![b"f".to_vec()]);
    assert!(rec.exists());
}
