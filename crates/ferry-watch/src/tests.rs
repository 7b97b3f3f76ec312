use super::*;

fn collect(p: &mut Pending, cs: Vec<Change>, now: Instant) -> Vec<String> {
    let mut notes = Vec::new();
    for c in cs {
        p.add(c, now, &mut |k, _| notes.push(k.to_string()));
    }
    notes
}

fn dirs(w: &Work) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = w
        .scope
        .dirs
        .iter()
        .map(|(d, deep)| (String::from_utf8_lossy(d).into_owned(), *deep))
        .collect();
    v.sort();
    v
}

#[test]
fn a_written_file_waits_for_its_close_or_for_quiet() {
    let settle = Duration::from_millis(100);
    let t0 = Instant::now();
    let mut p = Pending::default();
    collect(&mut p, vec![Change::Entry(0, b"a/f".to_vec(), false)], t0);
    assert!(p.take(t0, settle).is_none());
    assert_eq!(p.deadline(settle), Some(t0 + settle));
    // Written again later: the quiet time starts over.
    let t1 = t0 + Duration::from_millis(80);
    collect(&mut p, vec![Change::Entry(0, b"a/f".to_vec(), false)], t1);
    assert!(p.take(t0 + settle, settle).is_none());
    let (w, since) = p.take(t1 + settle, settle).expect("quiet");
    assert_eq!(since, t0);
    assert_eq!(dirs(&w), vec![("a".into(), false)]);
    // Closed: at once.
    collect(
        &mut p,
        vec![
            Change::Entry(0, b"g".to_vec(), false),
            Change::Entry(0, b"g".to_vec(), true),
        ],
        t1,
    );
    let (w, _) = p.take(t1, settle).expect("closed");
    assert_eq!(dirs(&w), vec![("".into(), false)]);
    assert!(p.items.is_empty() && p.deadline(settle).is_none());
}

#[test]
fn a_file_written_all_the_time_is_still_taken() {
    let settle = Duration::from_millis(100);
    let t0 = Instant::now();
    let mut p = Pending::default();
    let mut t = t0;
    while t < t0 + max_wait(settle) {
        collect(&mut p, vec![Change::Entry(0, b"log".to_vec(), false)], t);
        assert!(p.take(t, settle).is_none());
        t += Duration::from_millis(50);
    }
    assert!(p.take(t, settle).is_some());
}

#[test]
fn a_directory_rename_moves_what_is_pending_inside() {
    let settle = Duration::from_millis(100);
    let t0 = Instant::now();
    let mut p = Pending::default();
    collect(
        &mut p,
        vec![
            Change::Entry(0, b"d/x/f".to_vec(), false),
            Change::Rename(0, b"d/x".to_vec(), b"e/y".to_vec(), true),
            Change::Deep(0, b"n".to_vec()),
            Change::Dir(0, b"m".to_vec()),
        ],
        t0,
    );
    let (w, _) = p.take(t0, settle).expect("ready");
    assert_eq!(w.renames, vec![(b"d/x".to_vec(), b"e/y".to_vec(), true)]);
    assert_eq!(
        dirs(&w),
        vec![
            ("d".into(), false),
            ("e".into(), false),
            ("m".into(), false),
            ("n".into(), true)
        ]
    );
    // The file written inside, now under its new name, still waits.
    assert!(p.items.contains_key(&(0, b"e/y/f".to_vec())));
}

#[test]
fn overflow_and_roots_say_so_once_and_compare_everything() {
    let settle = Duration::from_millis(100);
    let t0 = Instant::now();
    let mut p = Pending::default();
    let n = collect(
        &mut p,
        vec![Change::Entry(0, b"f".to_vec(), true), Change::Overflow(0)],
        t0,
    );
    assert_eq!(n, vec!["overflow".to_string()]);
    let (w, _) = p.take(t0, settle).expect("full");
    assert!(w.full && p.items.is_empty());
    collect(
        &mut p,
        vec![Change::Gone(0), Change::Entry(0, b"f".to_vec(), true)],
        t0,
    );
    assert!(
        p.take(t0, settle).is_none(),
        "nothing runs while a root is gone"
    );
    assert!(p.deadline(settle).is_none(), "and no timer runs");
    collect(&mut p, vec![Change::Back(0)], t0);
    assert!(p.take(t0, settle).expect("back").0.full);
}
