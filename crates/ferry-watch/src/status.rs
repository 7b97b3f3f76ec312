//! What a watch has done, for `--status ADDR`: counters, the queue, recent
//! transfers and errors, bytes per second over the last minutes; served as
//! a page (inline SVG chart, no external assets), `/metrics` (Prometheus
//! text format) and `/status.json`, by one thread blocked in `accept()`.
//! Nothing ticks: the per-second series is filled in when it is asked for.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_engine::{Action, Reporter};

use crate::{Outcome, Work};

/// Seconds of throughput kept for the chart.
const SERIES_SECS: u64 = 300;
const RECENT: usize = 50;

#[derive(Default)]
struct Inner {
    what: String,
    started: u64,
    runs: u64,
    full_runs: u64,
    files: u64,
    bytes: u64,
    errors: u64,
    queue: usize,
    running: bool,
    watched: usize,
    last_latency: Option<Duration>,
    /// (unix ms, action, path, size)
    recent: VecDeque<(u64, &'static str, String, u64)>,
    /// (unix ms, path, error)
    errs: VecDeque<(u64, String, String)>,
    /// (unix second, bytes) of seconds that moved something.
    series: VecDeque<(u64, u64)>,
}

/// The watch's state as the status page shows it.
#[derive(Default)]
pub struct Status {
    inner: Mutex<Inner>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Status {
    /// A status for a watch of `what` (e.g. `SRC -> DST`).
    pub fn new(what: &str) -> Status {
        Status {
            inner: Mutex::new(Inner {
                what: what.to_string(),
                started: now_ms(),
                ..Inner::default()
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Directories watched.
    pub fn watched(&self, n: usize) {
        self.with(|i| i.watched += n);
    }

    /// Paths waiting.
    pub fn queue(&self, n: usize) {
        self.with(|i| i.queue = n);
    }

    /// A run begins (`queued`: paths still waiting).
    pub fn run_started(&self, w: &Work, queued: usize) {
        self.with(|i| {
            i.running = true;
            i.queue = queued;
            i.full_runs += u64::from(w.full);
        });
    }

    /// A run ended, `latency` after the oldest change it covered.
    pub fn run_done(&self, latency: Duration, out: &Outcome, queued: usize) {
        self.with(|i| {
            i.running = false;
            i.runs += 1;
            i.queue = queued;
            i.last_latency = Some(latency);
            if let Some(f) = &out.failed {
                push_err(i, String::new(), f.clone());
            }
        });
    }

    /// What a run that reports no single transfer (bisync) moved.
    pub fn moved(&self, files: u64, bytes: u64, errors: u64) {
        let sec = now_ms() / 1000;
        self.with(|i| {
            i.files += files;
            i.bytes += bytes;
            i.errors += errors;
            if bytes > 0 {
                i.series.push_back((sec, bytes));
            }
        });
    }

    fn action(&self, a: Action, path: &[u8], size: u64) {
        let ms = now_ms();
        self.with(|i| {
            if matches!(a, Action::Copy | Action::Update) {
                i.files += 1;
                i.bytes += size;
                let sec = ms / 1000;
                match i.series.back_mut() {
                    Some((s, b)) if *s == sec => *b += size,
                    _ => i.series.push_back((sec, size)),
                }
                while i.series.front().is_some_and(|(s, _)| s + SERIES_SECS < sec) {
                    i.series.pop_front();
                }
            }
            if i.recent.len() == RECENT {
                i.recent.pop_front();
            }
            let p = String::from_utf8_lossy(path).into_owned();
            i.recent.push_back((ms, a.as_str(), p, size));
        });
    }

    fn error(&self, path: &[u8], msg: String) {
        self.with(|i| {
            i.errors += 1;
            push_err(i, String::from_utf8_lossy(path).into_owned(), msg);
        });
    }

    /// `/metrics`: Prometheus text exposition format 0.0.4.
    pub fn metrics(&self) -> String {
        self.with(|i| {
            let lat = i.last_latency.map_or(0.0, |d| d.as_secs_f64());
            #[rustfmt::skip]
            let rows: [(&str, &str, &str, String); 9] = [
                ("ferry_watch_files_transferred_total", "counter", "Files copied or updated.", i.files.to_string()),
                ("ferry_watch_bytes_transferred_total", "counter", "Bytes of files copied or updated.", i.bytes.to_string()),
                ("ferry_watch_errors_total", "counter", "Entries that failed, and runs that could not happen.", i.errors.to_string()),
                ("ferry_watch_queue_length", "gauge", "Changed paths waiting for a run.", i.queue.to_string()),
                ("ferry_watch_runs_total", "counter", "Runs (scoped and full).", i.runs.to_string()),
                ("ferry_watch_full_runs_total", "counter", "Full runs (the first, after an overflow, a root back, a poll).", i.full_runs.to_string()),
                ("ferry_watch_watched_directories", "gauge", "Directories with an inotify watch when the watch began.", i.watched.to_string()),
                ("ferry_watch_running", "gauge", "1 while a run is in progress.", u8::from(i.running).to_string()),
                ("ferry_watch_last_change_latency_seconds", "gauge", "From the oldest change of the last run to its end.", format!("{lat:.6}")),
            ];
            let mut s = String::new();
            for (name, kind, help, v) in rows {
                let _ = write!(
                    s,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
                );
            }
            s
        })
    }

    /// `/status.json`.
    pub fn json(&self) -> String {
        self.with(|i| {
            let mut s = String::from("{");
            let _ = write!(
                s,
                "\"what\":{},\"files\":{},\"bytes\":{},\"errors\":{},\"queue\":{},\"runs\":{},\"running\":{},\"last_change_latency_s\":{},\"recent\":[",
                js(&i.what), i.files, i.bytes, i.errors, i.queue, i.runs, i.running,
                i.last_latency.map_or(0.0, |d| d.as_secs_f64())
            );
            for (n, (t, a, p, sz)) in i.recent.iter().enumerate() {
                let c = if n > 0 { "," } else { "" };
                let _ = write!(s, "{c}{{\"t_ms\":{t},\"type\":\"{a}\",\"path\":{},\"size\":{sz}}}", js(p));
            }
            s.push_str("],\"errs\":[");
            for (n, (t, p, e)) in i.errs.iter().enumerate() {
                let c = if n > 0 { "," } else { "" };
                let _ = write!(s, "{c}{{\"t_ms\":{t},\"path\":{},\"error\":{}}}", js(p), js(e));
            }
            s.push_str("]}");
            s
        })
    }

    /// The page.
    pub fn page(&self) -> String {
        let now = now_ms() / 1000;
        self.with(|i| {
            let mut h = String::with_capacity(8192);
            h.push_str("<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"2\"><title>ferry watch</title><style>body{font:14px sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}.num{text-align:right}svg{background:#f7f7f7}</style></head><body>");
            let _ = write!(h, "<h1>ferry watch</h1><p id=\"what\">{}</p>", esc(&i.what));
            let _ = write!(
                h,
                "<table id=\"counters\"><tr><th>files moved</th><td class=\"num\">{}</td></tr><tr><th>bytes moved</th><td class=\"num\">{}</td></tr><tr><th>queue</th><td class=\"num\" id=\"queue\">{}</td></tr><tr><th>runs</th><td class=\"num\">{}</td></tr><tr><th>errors</th><td class=\"num\">{}</td></tr><tr><th>last change to done</th><td class=\"num\">{}</td></tr><tr><th>state</th><td>{}</td></tr></table>",
                i.files, i.bytes, i.queue, i.runs, i.errors,
                i.last_latency.map_or("-".to_string(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3)),
                if i.running { "running" } else { "waiting for changes" }
            );
            h.push_str("<h2>Throughput (bytes per second, last 5 minutes)</h2>");
            chart(&mut h, &i.series, now);
            h.push_str("<h2>Recent</h2><table id=\"recent\"><tr><th>time (UTC)</th><th>action</th><th>path</th><th class=\"num\">size</th></tr>");
            for (t, a, p, sz) in i.recent.iter().rev() {
                let _ = write!(h, "<tr><td>{}</td><td>{a}</td><td class=\"path\">{}</td><td class=\"num\">{sz}</td></tr>", clock(*t), esc(p));
            }
            h.push_str("</table><h2>Errors</h2><table id=\"errors\">");
            for (t, p, e) in i.errs.iter().rev() {
                let _ = write!(h, "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", clock(*t), esc(p), esc(e));
            }
            let _ = write!(h, "</table><p>watching since {} UTC</p></body></html>", clock(i.started));
            h
        })
    }
}

fn push_err(i: &mut Inner, path: String, msg: String) {
    if i.errs.len() == RECENT {
        i.errs.pop_front();
    }
    i.errs.push_back((now_ms(), path, msg));
}

/// `HH:MM:SS` of a unix time in ms.
fn clock(ms: u64) -> String {
    let s = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// The throughput chart: one point per second, seconds without transfers
/// at zero.
fn chart(h: &mut String, series: &VecDeque<(u64, u64)>, now: u64) {
    let (w, ht) = (600.0, 150.0);
    let start = now.saturating_sub(SERIES_SECS);
    let max = series.iter().map(|s| s.1).max().unwrap_or(0).max(1) as f64;
    let mut pts = String::new();
    let mut it = series.iter().peekable();
    for sec in start..=now {
        while it.peek().is_some_and(|s| s.0 < sec) {
            it.next();
        }
        let v = match it.peek() {
            Some(s) if s.0 == sec => s.1,
            _ => 0,
        };
        let x = (sec - start) as f64 * w / SERIES_SECS as f64;
        let y = ht - v as f64 * (ht - 10.0) / max;
        let _ = write!(pts, "{x:.1},{y:.1} ");
    }
    let _ = write!(
        h,
        "<svg id=\"throughput\" width=\"{w}\" height=\"{}\" viewBox=\"0 0 {w} {}\" role=\"img\" aria-label=\"bytes per second\"><polyline fill=\"none\" stroke=\"#2a6fdb\" stroke-width=\"1.5\" points=\"{}\"/><text x=\"4\" y=\"12\" font-size=\"11\">{} B/s</text><text x=\"4\" y=\"{}\" font-size=\"11\">-5 min</text><text x=\"{}\" y=\"{}\" font-size=\"11\">now</text></svg>",
        ht + 14.0, ht + 14.0, pts.trim_end(), max as u64, ht + 12.0, w - 24.0, ht + 12.0
    );
}

fn esc(s: &str) -> String {
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

fn js(s: &str) -> String {
    let mut o = Vec::new();
    ferry_engine::encode::json_string(&mut o, s);
    String::from_utf8(o).unwrap_or_default()
}

/// A reporter that records into a [`Status`] and passes everything on.
pub struct Tee<'a> {
    /// Where actions and errors are shown.
    pub inner: &'a dyn Reporter,
    /// Where they are counted.
    pub status: &'a Status,
}

impl Reporter for Tee<'_> {
    fn action(&self, a: Action, path: &[u8], size: u64) {
        self.status.action(a, path, size);
        self.inner.action(a, path, size);
    }
    fn error(&self, path: &[u8], err: &io::Error) {
        self.status.error(path, err.to_string());
        self.inner.error(path, err);
    }
    fn skip(&self, path: &[u8], why: &str) {
        self.status.action(Action::Skip, path, 0);
        self.inner.skip(path, why);
    }
    fn hard_link(&self, path: &[u8], to: &[u8]) {
        self.status.action(Action::HardLink, path, 0);
        self.inner.hard_link(path, to);
    }
    fn kept(&self, path: &[u8], to: &[u8], size: u64) {
        self.status.action(Action::Keep, path, size);
        self.inner.kept(path, to, size);
    }
    fn note(&self, msg: &str) {
        self.inner.note(msg);
    }
    fn shows_actions(&self) -> bool {
        self.inner.shows_actions()
    }
}

/// Serve `status` on `addr` from a thread; with `token`, every request must
/// carry it (`Authorization: Bearer TOKEN`, or `?token=TOKEN`). Returns the
/// address bound.
pub fn serve(
    addr: SocketAddr,
    token: Option<String>,
    status: Arc<Status>,
) -> io::Result<SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let bound = l.local_addr()?;
    std::thread::Builder::new()
        .name("ferry-status".into())
        .spawn(move || {
            for c in l.incoming().flatten() {
                let _ = answer(c, token.as_deref(), &status);
            }
        })?;
    Ok(bound)
}

fn answer(mut c: TcpStream, token: Option<&str>, status: &Status) -> io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    c.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut r = BufReader::new(io::Read::take(c.try_clone()?, 16 << 10));
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut auth = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("authorization") {
                auth = v.trim().strip_prefix("Bearer ").map(str::to_string);
            }
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if let Some(t) = token {
        let q = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("token="))
            .map(str::to_string);
        if auth.as_deref() != Some(t) && q.as_deref() != Some(t) {
            return reply(&mut c, "401 Unauthorized", "text/plain", "token required\n");
        }
    }
    if method != "GET" {
        return reply(&mut c, "405 Method Not Allowed", "text/plain", "GET only\n");
    }
    match path {
        "/" | "/index.html" => reply(&mut c, "200 OK", "text/html; charset=utf-8", &status.page()),
        "/metrics" => reply(
            &mut c,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &status.metrics(),
        ),
        "/status.json" => reply(&mut c, "200 OK", "application/json", &status.json()),
        _ => reply(&mut c, "404 Not Found", "text/plain", "not found\n"),
    }
}

fn reply(c: &mut TcpStream, code: &str, ctype: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes())?;
    c.write_all(body.as_bytes())?;
    c.flush()
}
