//! The page of [`Status`] (HTML, an inline SVG chart, no external
//! assets) and the humanised forms of its figures.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use super::*;

impl Status {
    /// The page.
    pub fn page(&self) -> String {
        let snap = self.snap();
        let now = now_ms();
        let m = |name: &str| {
            snap.metrics
                .iter()
                .find(|x| x.0 == name)
                .map_or(0.0, |x| x.3)
        };
        self.with(|i| {
            let mut h = String::with_capacity(16 << 10);
            h.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"2\"><meta name=\"viewport\" content=\"width=device-width\"><title>ferry watch</title><style>\
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 1.5em;color:#222;max-width:70em}\
h1{font-size:1.3em;margin:0}h2{font-size:1.05em;margin:1.2em 0 .3em}\
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd;vertical-align:top}\
.num{text-align:right;font-variant-numeric:tabular-nums}.path{font-family:monospace;word-break:break-all}\
#state{padding:.6em 1em;border-radius:6px;margin:.8em 0;font-size:1.15em}\
.in_sync{background:#e3f4e1;border-left:6px solid #2e8b3a}.syncing{background:#e4eefb;border-left:6px solid #2a6fdb}\
.degraded{background:#fdecd9;border-left:6px solid #d9822b}.stopped{background:#eee;border-left:6px solid #777}\
#state ul{margin:.3em 0 0;font-size:.85em}svg{background:#f7f7f7}.muted{color:#777}.bad{color:#b3261e}\
</style></head><body>");
            let _ = write!(h, "<h1>ferry watch</h1><p id=\"what\" class=\"path\">{}</p>", esc(&i.what));
            state_block(&mut h, &snap, i, &m);
            counters(&mut h, i, &m);
            lists(&mut h, i, now);
            let _ = write!(h, "</table><p class=\"muted\">watching since <span data-metric=\"ferry_watch_start_time_seconds\" data-value=\"{}\">{}</span>; times are the host's local time; this page reloads every 2 s. Also: <a href=\"metrics\">/metrics</a>, <a href=\"status.json\">/status.json</a>.</p></body></html>", i.started / 1000, when(i.started));
            h
        })
    }
}

/// The state at the top: its title, the run's progress, why it is
/// degraded, the conflicts.
fn state_block(h: &mut String, snap: &Snap, i: &Inner, m: &dyn Fn(&str) -> f64) {
    // The state.
    let st = snap.state.as_str();
    let title = match snap.state {
        State::InSync => "In sync".to_string(),
        State::Syncing => "Syncing".to_string(),
        State::Degraded => "Degraded".to_string(),
        State::Stopped if i.stopped => "Stopped".to_string(),
        State::Stopped => "Stopping after the entry in flight".to_string(),
    };
    let _ = write!(
        h,
        "<div id=\"state\" class=\"{st}\" data-state=\"{st}\"><b>{title}</b>"
    );
    if let Some((files, bytes, eta)) = snap.progress {
        let _ = write!(
            h,
            " <span id=\"progress\">run in flight: <span data-metric=\"ferry_watch_run_remaining_files\" data-value=\"{files}\">{}</span> {}, <span data-metric=\"ferry_watch_run_remaining_bytes\" data-value=\"{bytes}\">{}</span> left to copy (of what it has found so far), ETA <span data-metric=\"ferry_watch_run_eta_seconds\" data-value=\"{}\">{}</span></span>",
            count(files),
            if files == 1 { "file" } else { "files" },
            bytes_h(bytes),
            num(m("ferry_watch_run_eta_seconds")),
            eta.map_or("unknown".to_string(), dur_h)
        );
    } else if snap.state == State::InSync {
        let _ = write!(
            h,
            " <span class=\"muted\">last run ended {}</span>",
            i.last_run_end.map_or("-".to_string(), when)
        );
    }
    let q = m("ferry_watch_queue_length") as u64;
    if q > 0 {
        let _ = write!(h, " <span>(<span data-metric=\"ferry_watch_queue_length\" data-value=\"{q}\">{}</span> changed paths waiting)</span>", count(q));
    }
    if !snap.reasons.is_empty() {
        h.push_str("<ul id=\"reasons\">");
        for r in &snap.reasons {
            let _ = write!(h, "<li>{}</li>", esc(r));
        }
        h.push_str("</ul>");
    }
    if i.conflicts > 0 {
        let _ = write!(
            h,
            "<div id=\"conflict-note\">{} since the watch began: both versions are kept (below)</div>",
            plural(i.conflicts, "conflict", "conflicts")
        );
    }
    h.push_str("</div>");
}

/// The counters, each a metric.
fn counters(h: &mut String, i: &Inner, m: &dyn Fn(&str) -> f64) {
    let q = m("ferry_watch_queue_length") as u64;
    // The counters.
    let lat = i.last_latency.map_or("-".to_string(), dur_h);
    #[rustfmt::skip]
    let rows: [(&str, &str, String); 13] = [
        ("files moved", "ferry_watch_transferred_files_total", count(i.files)),
        ("bytes moved", "ferry_watch_transferred_bytes_total", bytes_h(i.bytes)),
        ("errors", "ferry_watch_errors_total", count(i.entry_errors + i.refused)),
        ("of which runs refused", "ferry_watch_refused_runs_total", count(i.refused)),
        ("failing paths", "ferry_watch_failing_paths", count(i.failing.len() as u64)),
        ("conflicts", "ferry_watch_conflicts_total", count(i.conflicts)),
        ("queue (changed paths waiting)", "ferry_watch_queue_length", count(q)),
        ("runs", "ferry_watch_runs_total", count(i.runs)),
        ("of which full runs", "ferry_watch_full_runs_total", count(i.full_runs)),
        ("directories watched", "ferry_watch_watched_directories", count(m("ferry_watch_watched_directories") as u64)),
        ("directories without a watch", "ferry_watch_unwatched_directories", count(m("ferry_watch_unwatched_directories") as u64)),
        ("last change to synced", "ferry_watch_last_change_latency_seconds", lat),
        ("last run ended", "ferry_watch_last_run_end_time_seconds", i.last_run_end.map_or("-".to_string(), when)),
    ];
    h.push_str("<table id=\"counters\">");
    for (label, name, shown) in rows {
        let v = num(m(name));
        let _ = write!(h, "<tr><th>{label}</th><td class=\"num\" data-metric=\"{name}\" data-value=\"{v}\" title=\"{name} {v}\">{}</td></tr>", esc(&shown));
    }
    h.push_str("</table>");
}

/// The chart, the conflicts, failing paths, recent actions and errors.
fn lists(h: &mut String, i: &Inner, now: u64) {
    h.push_str("<h2>Throughput, last 5 minutes</h2>");
    chart(h, &i.series, now / 1000);
    // Conflicts, failing paths.
    if !i.conflict_list.is_empty() {
        h.push_str("<h2>Conflicts</h2><table id=\"conflicts\"><tr><th>time</th><th>side</th><th>path</th><th>the other version kept as</th></tr>");
        for c in i.conflict_list.iter().rev() {
            let _ = write!(h, "<tr><td>{}</td><td>{}</td><td class=\"path\">{}</td><td class=\"path\">{}</td></tr>", when(c.ms), esc(&c.side), esc(&c.path), esc(&c.other));
        }
        h.push_str("</table>");
    }
    if !i.failing.is_empty() {
        h.push_str("<h2>Failing paths</h2><table id=\"failing\"><tr><th>since</th><th>side</th><th>path</th><th>error</th></tr>");
        for ((side, path), (t, msg)) in &i.failing {
            let _ = write!(h, "<tr><td>{}</td><td>{}</td><td class=\"path\">{}</td><td class=\"bad\">{}</td></tr>", when(*t), esc(side), esc(path), esc(msg));
        }
        h.push_str("</table>");
    }
    h.push_str("<h2>Recent</h2><table id=\"recent\"><tr><th>time</th><th>side</th><th>action</th><th>path</th><th class=\"num\">size</th></tr>");
    for r in i.recent.iter().rev() {
        let _ = write!(h, "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"path\">{}</td><td class=\"num\" title=\"{} bytes\">{}</td></tr>", when(r.ms), esc(&r.side), r.action, esc(&r.path), r.size, if r.size > 0 || matches!(r.action, "copy" | "update") { bytes_h(r.size) } else { String::new() });
    }
    h.push_str("</table><h2>Errors</h2><table id=\"errors\"><tr><th>time</th><th>side</th><th>path</th><th>error</th></tr>");
    for e in i.errs.iter().rev() {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=\"path\">{}</td><td class=\"bad\">{}</td></tr>",
            when(e.ms),
            esc(&e.side),
            esc(&e.path),
            esc(&e.msg)
        );
    }
}

/// A metric's value as the text format writes it: integers without a
/// fraction.
pub(super) fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.6}")
    }
}

pub(super) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// A count, humanised: `950`, `1.2k`, `3.4M`.
pub fn count(n: u64) -> String {
    match n {
        0..1000 => n.to_string(),
        1000..999_950 => format!("{:.1}k", n as f64 / 1e3),
        999_950..999_950_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.1}G", n as f64 / 1e9),
    }
}

/// Bytes, humanised (binary units): `512 B`, `4.0 KiB`, `1.2 GiB`.
pub fn bytes_h(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1023.95 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A duration, humanised: `0.4 ms`, `31.7 ms`, `2.3 s`, `4 min 5 s`, `2 h 3 min`.
pub fn dur_h(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{} min {} s", s as u64 / 60, s as u64 % 60)
    } else {
        format!("{} h {} min", s as u64 / 3600, s as u64 / 60 % 60)
    }
}

/// A unix time in ms as the host's local date and time, with its zone:
/// `2026-11-27 10:42:03 CET`.
pub(super) fn when(ms: u64) -> String {
    let Ok(t) = jiff::Timestamp::from_millisecond(ms as i64) else {
        return ms.to_string();
    };
    t.to_zoned(jiff::tz::TimeZone::system())
        .strftime("%Y-%m-%d %H:%M:%S %Z")
        .to_string()
}

/// A round maximum for the chart's scale, at or above `v`: 1, 2 or 5 times
/// a power of 10 of the binary unit it is shown in (`500 KiB`, `2 MiB`).
pub(super) fn nice(v: u64) -> u64 {
    let mut unit = 1u64;
    while v / unit >= 1024 && unit < 1 << 50 {
        unit <<= 10;
    }
    nice10(v.div_ceil(unit)).saturating_mul(unit)
}

/// 1, 2 or 5 times a power of 10, at or above `v`.
fn nice10(v: u64) -> u64 {
    let mut p = 1u64;
    loop {
        for m in [1, 2, 5] {
            if p.saturating_mul(m) >= v {
                return p.saturating_mul(m);
            }
        }
        p = p.saturating_mul(10);
    }
}

/// The throughput chart: one point per second of the last 5 minutes,
/// seconds without transfers at zero; its scale is that of what it shows.
pub(super) fn chart(h: &mut String, series: &VecDeque<(u64, u64)>, now: u64) {
    let (w, ht) = (600.0, 150.0);
    let start = now.saturating_sub(SERIES_SECS);
    let shown = || series.iter().filter(|s| s.0 >= start && s.0 <= now);
    let max = nice(shown().map(|s| s.1).max().unwrap_or(0).max(1));
    let mut pts = String::new();
    let mut it = shown().peekable();
    for sec in start..=now {
        while it.peek().is_some_and(|s| s.0 < sec) {
            it.next();
        }
        let v = match it.peek() {
            Some(s) if s.0 == sec => s.1,
            _ => 0,
        };
        let x = (sec - start) as f64 * w / SERIES_SECS as f64;
        let y = ht - v as f64 * (ht - 10.0) / max as f64;
        let _ = write!(pts, "{x:.1},{y:.1} ");
    }
    let _ = write!(
        h,
        "<svg id=\"throughput\" width=\"{w}\" height=\"{}\" viewBox=\"0 0 {w} {}\" role=\"img\" aria-label=\"bytes per second, last 5 minutes\" data-max=\"{max}\"><line x1=\"0\" x2=\"{w}\" y1=\"10\" y2=\"10\" stroke=\"#ddd\"/><line x1=\"0\" x2=\"{w}\" y1=\"{}\" y2=\"{}\" stroke=\"#eee\"/><polyline fill=\"none\" stroke=\"#2a6fdb\" stroke-width=\"1.5\" points=\"{}\"/><text x=\"4\" y=\"22\" font-size=\"11\">{}/s</text><text x=\"4\" y=\"{}\" font-size=\"11\">-5 min</text><text x=\"{}\" y=\"{}\" font-size=\"11\">now</text></svg>",
        ht + 14.0,
        ht + 14.0,
        10.0 + (ht - 10.0) / 2.0,
        10.0 + (ht - 10.0) / 2.0,
        pts.trim_end(),
        bytes_h(max),
        ht + 12.0,
        w - 24.0,
        ht + 12.0
    );
}

pub(super) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

pub(super) fn js(s: &str) -> String {
    let mut o = Vec::new();
    ferry_engine::encode::json_string(&mut o, s);
    String::from_utf8(o).unwrap_or_default()
}
