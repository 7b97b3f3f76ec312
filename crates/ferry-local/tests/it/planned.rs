//! Checked at the act (issue 28, 2): the local store replaces, removes or
//! moves away an entry only while it is what the plan saw (kind, inode,
//! size, mtime: one `statx` right before the rename or unlink), and names
//! a file only where the plan saw nothing; otherwise it fails with
//! `Changed` and changes nothing. Every write path: an unnamed temporary
//! (`O_TMPFILE`), a named one, a removal, a keep.

use std::fs;
use std::path::Path;

use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::store::StoreExt;
use ferry_engine::store::{is_changed, Planned, Store};
use ferry_local::LocalStore;

/// Write `data` through the store into `name` of the root, expecting
/// `at` there (`Some`: the planned entry; `None`: nothing).
fn put(
    s: &LocalStore,
    name: &std::ffi::CStr,
    data: &[u8],
    at: Option<&Planned>,
) -> std::io::Result<()> {
    let (root, _) = s.open_root()?.expect("root");
    fs::write(s.root().join("src"), data)?;
    let meta = s.stat(&root, c"src")?.expect("src");
    let mut reader = s.open_file(&root, c"src")?;
    let mut w = s.create_file(&root, name, &meta)?;
    s.write_from(&root, &mut w, &mut reader, meta.size, None)?;
    s.expect(&mut w, at);
    let res = s.commit(&root, w, name, &meta, false);
    fs::remove_file(s.root().join("src"))?;
    res
}

fn stat(s: &LocalStore, name: &std::ffi::CStr) -> ferry_engine::entry::Meta {
    let (root, _) = s.open_root().unwrap().unwrap();
    s.stat(&root, name).unwrap().unwrap()
}

fn setup() -> (tempfile::TempDir, LocalStore) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("r");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("seed"), b"seed").unwrap();
    fs::write(root.join("f"), b"old").unwrap();
    let s = LocalStore::new(&root, 1);
    (t, s)
}

fn append(p: &Path, b: &[u8]) {
    use std::io::Write;
    fs::OpenOptions::new()
        .append(true)
        .open(p)
        .unwrap()
        .write_all(b)
        .unwrap();
}

#[test]
fn a_commit_replaces_only_the_entry_planned() {
    let (t, s) = setup();
    let f = t.path().join("r/f");
    let planned = Planned::new(&stat(&s, c"f"), 1);
    // Unchanged: replaced.
    put(&s, c"f", b"new", Some(&planned)).unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"new");
    // Changed since listed (appended to): left alone.
    let planned = Planned::new(&stat(&s, c"f"), 1);
    append(&f, b"+edit");
    let e = put(&s, c"f", b"newer", Some(&planned)).unwrap_err();
    assert!(is_changed(&e), "{e}");
    assert_eq!(fs::read(&f).unwrap(), b"new+edit");
    // Replaced by another file of the same size and mtime: left alone.
    let planned = Planned::new(&stat(&s, c"f"), 1);
    let m = fs::metadata(&f).unwrap();
    fs::write(t.path().join("r/other"), b"NEW+EDIT").unwrap();
    fs::File::options()
        .write(true)
        .open(t.path().join("r/other"))
        .unwrap()
        .set_modified(m.modified().unwrap())
        .unwrap();
    fs::rename(t.path().join("r/other"), &f).unwrap();
    let e = put(&s, c"f", b"newest", Some(&planned)).unwrap_err();
    assert!(is_changed(&e), "{e}");
    assert_eq!(fs::read(&f).unwrap(), b"NEW+EDIT");
    // Planned free, taken since: left alone.
    fs::write(t.path().join("r/g"), b"someone's").unwrap();
    let e = put(&s, c"g", b"ours", None).unwrap_err();
    assert!(is_changed(&e), "{e}");
    assert_eq!(fs::read(t.path().join("r/g")).unwrap(), b"someone's");
    // Free: named.
    put(&s, c"h", b"ours", None).unwrap();
    assert_eq!(fs::read(t.path().join("r/h")).unwrap(), b"ours");
    // No temporary left behind.
    let names: Vec<_> = fs::read_dir(t.path().join("r"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(".ferry")), "{names:?}");
}

#[test]
fn a_removal_or_keep_acts_only_on_the_entry_planned() {
    let (t, s) = setup();
    let f = t.path().join("r/f");
    let (root, _) = s.open_root().unwrap().unwrap();
    let planned = Planned::new(&stat(&s, c"f"), 1);
    append(&f, b"+edit");
    let e = s.remove_planned(&root, c"f", &planned).unwrap_err();
    assert!(is_changed(&e), "{e}");
    assert_eq!(fs::read(&f).unwrap(), b"old+edit");
    // Moved away (a keep before a removal) only while unchanged.
    let base = KeepBase::Root(b".bak".to_vec());
    let to = KeepTo {
        base: &base,
        path: b"f",
        overwrite: true,
        replacing: false,
        planned: Some(planned),
    };
    let e = s.keep_entry(&root, c"f", &to).unwrap_err();
    assert!(is_changed(&e), "{e}");
    assert_eq!(fs::read(&f).unwrap(), b"old+edit");
    let to = KeepTo {
        planned: Some(Planned::new(&stat(&s, c"f"), 1)),
        ..to
    };
    s.keep_entry(&root, c"f", &to).unwrap();
    assert!(!f.exists());
    assert_eq!(fs::read(t.path().join("r/.bak/f")).unwrap(), b"old+edit");
    // Unchanged: removed.
    let planned = Planned::new(&stat(&s, c"seed"), 1);
    s.remove_planned(&root, c"seed", &planned).unwrap();
    assert!(!t.path().join("r/seed").exists());
}

/// Overwrite the bytes of `p` in place (same size) and put its mtime back:
/// only the change time tells.
fn edit_behind(p: &Path, b: &[u8]) {
    use std::os::unix::fs::FileExt;
    let m = fs::metadata(p).unwrap();
    assert_eq!(m.len(), b.len() as u64);
    let f = fs::File::options().write(true).open(p).unwrap();
    f.write_all_at(b, 0).unwrap();
    f.set_modified(m.modified().unwrap()).unwrap();
    drop(f);
    let n = fs::metadata(p).unwrap();
    assert_eq!(
        (n.len(), n.modified().unwrap()),
        (m.len(), m.modified().unwrap())
    );
}

#[test]
fn an_edit_that_puts_size_and_mtime_back_is_seen_by_the_change_time() {
    let (t, s) = setup();
    let f = t.path().join("r/f");
    let (root, _) = s.open_root().unwrap().unwrap();
    let listed = stat(&s, c"f");
    assert_ne!(listed.ctime, 0, "statx gives the change time");
    // The plan's equality leaves it out (two replicas never share one).
    assert_eq!(listed, ferry_engine::entry::Meta { ctime: 1, ..listed });
    let planned = Planned::new(&listed, 1);
    edit_behind(&f, b"OLD");
    // A commit over it, a removal, a keep (moved away, or linked before a
    // replace): all refused, the edit kept.
    let e = put(&s, c"f", b"new", Some(&planned)).unwrap_err();
    assert!(is_changed(&e), "{e}");
    let e = s.remove_planned(&root, c"f", &planned).unwrap_err();
    assert!(is_changed(&e), "{e}");
    let base = KeepBase::Root(b".bak".to_vec());
    for replacing in [false, true] {
        let to = KeepTo {
            base: &base,
            path: b"f",
            overwrite: false,
            replacing,
            planned: Some(planned),
        };
        let e = s.keep_entry(&root, c"f", &to).unwrap_err();
        assert!(is_changed(&e), "{e}");
    }
    assert_eq!(fs::read(&f).unwrap(), b"OLD");
    assert!(!t.path().join("r/.bak").exists());
    // Listed anew: kept as a hard link first, then replaced (the link
    // moved the change time, and gave the file a second name: the commit
    // after it leaves the change time out).
    let planned = Planned::new(&stat(&s, c"f"), 1);
    let to = KeepTo {
        base: &base,
        path: b"f",
        overwrite: false,
        replacing: true,
        planned: Some(planned),
    };
    s.keep_entry(&root, c"f", &to).unwrap();
    put(&s, c"f", b"new", Some(&planned)).unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"new");
    assert_eq!(fs::read(t.path().join("r/.bak/f")).unwrap(), b"OLD");
}

#[test]
fn the_change_time_of_a_file_with_several_names_is_not_compared() {
    // Replacing one name of a hard-linked file moves the change time of
    // the others (its link count drops): the run's own act, not an edit.
    let (t, s) = setup();
    fs::hard_link(t.path().join("r/f"), t.path().join("r/g")).unwrap();
    let planned_f = Planned::new(&stat(&s, c"f"), 1);
    let planned_g = Planned::new(&stat(&s, c"g"), 1);
    put(&s, c"f", b"nf", Some(&planned_f)).unwrap();
    put(&s, c"g", b"ng", Some(&planned_g)).unwrap();
    assert_eq!(fs::read(t.path().join("r/g")).unwrap(), b"ng");
}

/// A file listed with two names, written to since, then both names replaced
/// or removed (as a run whose `-H` regrouping gives each name another file
/// does): the first goes, since the bytes stay under the other name; the last
/// is checked in full and left alone, so the write is never lost. Checks of
/// such files run one at a time, so two acts cannot both see the other name.
#[test]
fn a_file_of_two_names_written_since_keeps_its_bytes_under_the_last() {
    let (t, s) = setup();
    let f = t.path().join("r/f");
    fs::hard_link(&f, t.path().join("r/g")).unwrap();
    let (root, _) = s.open_root().unwrap().unwrap();
    let (pf, pg) = (
        Planned::new(&stat(&s, c"f"), 1),
        Planned::new(&stat(&s, c"g"), 1),
    );
    assert_eq!(pf.meta.nlink, 2);
    append(&f, b"+edit");
    // Replaced while another name holds the bytes.
    put(&s, c"f", b"new", Some(&pf)).unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"new");
    // The last name: size and mtime compared, the edit left alone.
    let e = s.remove_planned(&root, c"g", &pg).unwrap_err();
    assert!(is_changed(&e), "{e}");
    let e = put(&s, c"g", b"new", Some(&pg)).unwrap_err();
    assert!(is_changed(&e), "{e}");
    assert_eq!(fs::read(t.path().join("r/g")).unwrap(), b"old+edit");

    // Both names at once from many threads: one act at most goes through.
    for round in 0..20 {
        let a = t.path().join(format!("r/a{round}"));
        let b = t.path().join(format!("r/b{round}"));
        fs::write(&a, b"old").unwrap();
        fs::hard_link(&a, &b).unwrap();
        let (ca, cb) = (
            std::ffi::CString::new(format!("a{round}")).unwrap(),
            std::ffi::CString::new(format!("b{round}")).unwrap(),
        );
        let (pa, pb) = (
            Planned::new(&stat(&s, &ca), 1),
            Planned::new(&stat(&s, &cb), 1),
        );
        append(&a, b"+edit");
        let done = std::thread::scope(|sc| {
            let ra = sc.spawn(|| s.remove_planned(&root, &ca, &pa).is_ok());
            let rb = sc.spawn(|| s.remove_planned(&root, &cb, &pb).is_ok());
            [ra.join().unwrap(), rb.join().unwrap()]
        });
        assert_eq!(done.iter().filter(|d| **d).count(), 1, "round {round}");
        let left = if a.exists() { &a } else { &b };
        assert_eq!(fs::read(left).unwrap(), b"old+edit", "round {round}");
    }
}
