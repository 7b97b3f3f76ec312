//! Tests of [`super`] (status.rs).

use super::page::{chart, nice};
use super::*;

/// Every figure the page shows names its metric and carries its
/// exact value.
fn page_figures(page: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = page;
    while let Some(i) = rest.find("data-metric=\"") {
        rest = &rest[i + 13..];
        let name = rest[..rest.find('"').unwrap()].to_string();
        let j = rest.find("data-value=\"").unwrap();
        let v = &rest[j + 12..];
        out.push((name, v[..v.find('"').unwrap()].to_string()));
    }
    out
}

fn metric(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} in\n{text}"))
        .to_string()
}

#[test]
fn every_figure_on_the_page_is_a_metric_with_the_same_value() {
    let s = Status::new("a -> b");
    s.watched(3);
    s.run_started(
        &Work {
            full: true,
            ..Work::default()
        },
        0,
    );
    s.record("DST", "copy", b"x", 5000, None);
    s.failure("DST", b"y", "open: Permission denied".into());
    s.run_done(Duration::from_millis(12), &Outcome::default(), 0);
    s.run_started(&Work::default(), 0);
    s.run_done(
        Duration::from_millis(3),
        &Outcome {
            failed: Some("refused: SRC is empty".into()),
            refused: true,
            ..Outcome::default()
        },
        0,
    );
    let (page, text) = (s.page(), s.metrics());
    let figs = page_figures(&page);
    assert!(figs.len() >= 13, "{figs:?}");
    for (name, v) in figs {
        assert_eq!(metric(&text, &name), v, "{name}");
    }
    // The refusal counts as an error, and in its own counter.
    assert_eq!(metric(&text, "ferry_watch_errors_total"), "2");
    assert_eq!(metric(&text, "ferry_watch_refused_runs_total"), "1");
    assert_eq!(metric(&text, "ferry_watch_failing_paths"), "1");
    assert_eq!(metric(&text, "ferry_watch_state{state=\"degraded\"}"), "1");
    assert!(page.contains("data-state=\"degraded\"") && page.contains("SRC is empty"));
    assert!(page.contains("4.9 KiB"), "humanised");
}

#[test]
fn a_path_that_fails_is_listed_until_a_run_of_its_directory_succeeds() {
    let s = Status::new("a -> b");
    s.run_started(&Work::default(), 0);
    s.failure("DST", b"d/f", "x".into());
    s.run_done(Duration::ZERO, &Outcome::default(), 0);
    assert_eq!(s.state(), State::Degraded);
    // A run of another directory: still failing.
    let mut w = Work::default();
    w.scope.dirs.push((b"e".to_vec(), false));
    s.run_started(&w, 0);
    s.run_done(Duration::ZERO, &Outcome::default(), 0);
    assert_eq!(s.state(), State::Degraded);
    let mut w = Work::default();
    w.scope.dirs.push((b"d".to_vec(), false));
    s.run_started(&w, 0);
    s.run_done(Duration::ZERO, &Outcome::default(), 0);
    assert_eq!(s.state(), State::InSync);
}

#[test]
fn states() {
    let s = Status::new("a -> b");
    assert_eq!(s.state(), State::InSync);
    s.run_started(&Work::default(), 0);
    assert_eq!(s.state(), State::Syncing);
    s.run_done(Duration::ZERO, &Outcome::default(), 0);
    s.change(&Change::Gone(0));
    assert_eq!(s.state(), State::Degraded);
    s.change(&Change::Back(0));
    assert_eq!(s.state(), State::InSync);
    s.change(&Change::Overflow(0));
    assert_eq!(s.state(), State::Degraded);
    s.run_started(
        &Work {
            full: true,
            ..Work::default()
        },
        0,
    );
    s.run_done(Duration::ZERO, &Outcome::default(), 0);
    assert_eq!(s.state(), State::InSync);
    s.gauges().arrived(2);
    assert_eq!(s.state(), State::Syncing);
    s.gauges().taken(2);
    s.stopping();
    assert_eq!(s.state(), State::Stopped);
}

#[test]
fn a_run_in_flight_shows_what_is_left_and_feeds_the_chart_as_it_moves() {
    let s = Status::new("a -> b");
    s.run_started(&Work::default(), 0);
    let st = s.run_stats();
    Stats::add(&st.files_planned, 3);
    Stats::add(&st.bytes_planned, 3 << 20);
    Stats::add(&st.files_copied, 1);
    Stats::add(&st.bytes_moved, 1 << 20);
    let text = s.metrics();
    assert_eq!(metric(&text, "ferry_watch_run_remaining_files"), "2");
    assert_eq!(
        metric(&text, "ferry_watch_run_remaining_bytes"),
        (2u64 << 20).to_string()
    );
    assert_eq!(metric(&text, "ferry_watch_state{state=\"syncing\"}"), "1");
    let page = s.page();
    assert!(page.contains("2.0 MiB</span> left"), "{page}");
    // The mebibyte moved is on the chart before the copy ends.
    assert_eq!(
        s.with(|i| i.series.iter().map(|x| x.1).sum::<u64>()),
        1 << 20
    );
    // Spread over the seconds it took, in order.
    s.with(|i| {
        i.sampled_sec -= 4;
        Stats::add(&st.bytes_moved, 4000);
        sample(i, now_ms() / 1000);
        assert!(
            i.series.iter().filter(|x| x.1 == 1000).count() >= 3,
            "{:?}",
            i.series
        );
        assert!(i
            .series
            .iter()
            .zip(i.series.iter().skip(1))
            .all(|(a, b)| a.0 < b.0));
    });
}

#[test]
fn hostile_names_are_shown_escaped_everywhere() {
    let s = Status::new("<i>a</i> -> b");
    let name: &[u8] = b"<script>alert(1)</script>\n\"&'\xff";
    s.run_started(&Work::default(), 0);
    s.record("DST", "copy", name, 1, None);
    s.failure("DST", name, "<em>".into());
    s.record("B", "conflict", name, 1, Some(name));
    s.run_done(Duration::ZERO, &Outcome::default(), 0);
    let page = s.page();
    assert!(!page.contains("<script>") && !page.contains("<em>") && !page.contains("<i>"));
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;\n&quot;&amp;&#39;\u{fffd}"),
        "{page}"
    );
    let json = s.json();
    assert!(json.contains("\\n\\\"&'\u{fffd}"), "{json}");
    assert!(!json.contains('\n'), "one line: {json}");
}

#[test]
fn an_engine_error_names_its_side_and_operation() {
    let e = ferry_engine::store::op_err(io::Error::from_raw_os_error(1), Some(End::Dst), "rename");
    assert_eq!(
        side_of(&e),
        ("DST", "rename: Operation not permitted".to_string())
    );
    assert_eq!(
        side_of(&io::Error::from_raw_os_error(2)).1,
        "No such file or directory"
    );
}

#[test]
fn humanised() {
    assert_eq!(count(999), "999");
    assert_eq!(count(1234), "1.2k");
    assert_eq!(count(6927), "6.9k");
    assert_eq!(bytes_h(1023), "1023 B");
    assert_eq!(bytes_h(4099), "4.0 KiB");
    assert_eq!(bytes_h(200 << 20), "200.0 MiB");
    assert_eq!(dur_h(Duration::from_micros(31_700)), "31.7 ms");
    assert_eq!(dur_h(Duration::from_secs(125)), "2 min 5 s");
}

#[test]
fn the_charts_scale_follows_what_it_shows() {
    let mut series = VecDeque::new();
    series.push_back((1000, 50 << 20));
    series.push_back((1400, 3000));
    let mut h = String::new();
    // The 50 MiB second is out of the window: the scale is 3000's.
    chart(&mut h, &series, 1400);
    assert!(
        h.contains("data-max=\"5120\"") && h.contains(">5.0 KiB/s<"),
        "{h}"
    );
    assert_eq!(nice(262_144), 500 << 10);
    assert_eq!(nice(1000), 1000);
    assert_eq!(nice(3 << 20), 5 << 20);
}
