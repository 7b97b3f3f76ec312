use super::*;

#[test]
fn records_round_trip_and_are_trusted_only_whole() {
    let mut set = RangeSet::new();
    set.insert(0, 10);
    set.insert(20, 30);
    let t = record_text("5 1.000000002", &set);
    assert_eq!(parse_record(&t, "5 1.000000002"), Some(set.clone()));
    // Another source, a record cut short: nothing trusted.
    assert_eq!(parse_record(&t, "5 1.000000003"), None);
    for cut in 0..t.len() - 1 {
        assert_eq!(parse_record(&t[..cut], "5 1.000000002"), None, "{cut}");
    }
    assert_eq!(
        parse_record(b"ferry sftp partial 1\nx\n9-3\nend\n", "x"),
        None
    );
    // Rewritten in place with fewer lines (ranges merged): the old
    // text's tail after the end line is not read.
    let mut more = set.clone();
    more.insert(10, 20);
    more.insert(40, 50);
    let mut over = t.clone();
    let new = record_text("5 1.000000002", &more);
    assert!(new.len() < t.len() + 8);
    over.resize(over.len().max(new.len()), b'x');
    over[..new.len()].copy_from_slice(&new);
    assert_eq!(parse_record(&over, "5 1.000000002"), Some(more));
}
