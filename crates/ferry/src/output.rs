//! What the user sees: action lines (`-v`, `--dry-run`), JSON lines
//! (`--json`), errors on stderr (`ferry: PATH: cause`), the progress bar and
//! the summary. Every name goes through `ferry_engine::encode` (escaped in
//! text, lossless in JSON): a name can never forge a line.

use parking_lot::Mutex;
use std::io::{self, Write};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ferry_engine::encode::{json_name, json_string, text_name, text_name_string};
use ferry_engine::{Action, Reporter, Stats, Summary};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use ferry_engine::class::cause;

/// An error line, `ferry: PATH: cause`, with the path and the cause escaped
/// (neither can start a line of its own).
pub fn error_line(path: &[u8], cause: &str) -> String {
    format!(
        "ferry: {}: {}",
        text_name_string(path),
        text_name_string(cause.as_bytes())
    )
}

pub struct CliReporter {
    json: bool,
    lines: bool,
    dry_run: bool,
    /// Why the run was refused (exit 2): `"refused"` in the JSON summary.
    refused: Option<String>,
    out: Mutex<io::BufWriter<io::Stdout>>,
    bar: Mutex<Option<ProgressBar>>,
    /// The directories of `.ferry-versions` versions were kept in since
    /// the last [`CliReporter::take_kept_dirs`], by replica (0: DST or
    /// A, 1: B): where a watch prunes.
    /// (A set: a run that keeps a million files in ten directories holds
    /// ten entries.)
    kept_dirs: Mutex<std::collections::BTreeSet<(usize, Vec<u8>)>>,
}

impl CliReporter {
    pub fn new(json: bool, lines: bool, dry_run: bool) -> CliReporter {
        CliReporter {
            json,
            lines,
            dry_run,
            refused: None,
            out: Mutex::new(io::BufWriter::new(io::stdout())),
            bar: Mutex::new(None),
            kept_dirs: Default::default(),
        }
    }

    /// Note a keep of replica `side` at `to` (its path below the root).
    fn note_kept(&self, side: usize, to: &[u8]) {
        let v = ferry_engine::keep::VERSIONS_DIR;
        if let Some(rest) = to.strip_prefix(v).and_then(|r| r.strip_prefix(b"/")) {
            let (dir, _) = ferry_engine::keep::split_parent(rest);
            self.kept_dirs.lock().insert((side, dir.to_vec()));
        }
    }

    /// The directories of `.ferry-versions` versions were kept in since
    /// the last call, by replica.
    pub fn take_kept_dirs(&self) -> Vec<(usize, Vec<u8>)> {
        std::mem::take(&mut *self.kept_dirs.lock())
            .into_iter()
            .collect()
    }

    /// An action naming two paths: `{"type":KIND,"path":..,"KEY":..,"size":N}`
    /// with `--json`, `KIND PATH -> OTHER` with -v (` -> ` appears in a
    /// name only escaped).
    fn pair_line(&self, kind: &str, path: &[u8], key: &str, other: &[u8], size: u64) {
        self.pair_line_sep(kind, path, key, other, size, b" -> ")
    }

    /// [`CliReporter::pair_line`] with `sep` between the names in text.
    fn pair_line_sep(
        &self,
        kind: &str,
        path: &[u8],
        key: &str,
        other: &[u8],
        size: u64,
        sep: &[u8],
    ) {
        if self.json {
            let mut line = Vec::with_capacity(64 + path.len() + other.len());
            let _ = write!(line, "{{\"type\":\"{kind}\",");
            json_name(&mut line, "path", path);
            line.push(b',');
            json_name(&mut line, key, other);
            let _ = writeln!(line, ",\"size\":{size}}}");
            let _ = self.out.lock().write_all(&line);
        } else if self.lines {
            let mut line = format!("{kind} ").into_bytes();
            text_name(&mut line, path);
            line.extend_from_slice(sep);
            text_name(&mut line, other);
            line.push(b'\n');
            self.with_bar_suspended(|| {
                let _ = self.out.lock().write_all(&line);
            });
        }
    }

    fn with_bar_suspended(&self, f: impl FnOnce()) {
        let bar = self.bar.lock().clone();
        match bar {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }

    /// Write out the lines held so far (`--watch`: after each run).
    pub fn flush(&self) {
        let _ = self.out.lock().flush();
    }

    /// The summary of copy and sync: symlinks counted apart from files, and
    /// ferry's own stale temporaries removed (text: only when there were any).
    pub fn summary(&self, s: &Summary) {
        self.write_summary(
            s,
            &[
                ("symlinks_created", "symlinks", s.symlinks_created, true),
                ("hard_links", "hard links", s.hard_links, s.hard_links > 0),
                (
                    "specials_created",
                    "special files",
                    s.specials_created,
                    s.specials_created > 0,
                ),
                (
                    "temporaries_removed",
                    "stale temporaries removed",
                    s.temps_removed,
                    s.temps_removed > 0,
                ),
                ("files_kept", "kept", s.files_kept, s.files_kept > 0),
                ("bytes_kept", "bytes kept", s.bytes_kept, false),
            ],
        );
    }

    /// The last line of a run: the counters of `s`, with `extra` counters
    /// (JSON key, text label, value, shown in text) after `dirs_created`.
    fn write_summary(&self, s: &Summary, extra: &[(&str, &str, u64, bool)]) {
        let mut out = self.out.lock();
        if self.json {
            let mut x = String::new();
            for (k, _, v, _) in extra {
                x.push_str(&format!(",\"{k}\":{v}"));
            }
            let d = &s.delta;
            if d.files > 0 || d.fallbacks > 0 || d.wire > 0 {
                x.push_str(&format!(
                    ",\"delta_files\":{},\"literal_bytes\":{},\"matched_bytes\":{},\"wire_bytes\":{},\"delta_fallbacks\":{}",
                    d.files, d.literal, d.matched, d.wire, d.fallbacks
                ));
            }
            let mut tail = String::from(if self.dry_run {
                ",\"dry_run\":true"
            } else {
                ""
            });
            if let Some(r) = &self.refused {
                tail.push_str(",\"refused\":");
                tail.push_str(&serde_json::Value::from(r.as_str()).to_string());
            }
            let _ = writeln!(
                out,
                "{{\"type\":\"summary\",\"entries_scanned\":{},\"files_copied\":{},\"bytes_copied\":{},\"files_deleted\":{},\"dirs_created\":{}{x},\"unchanged\":{},\"errors\":{},\"elapsed_s\":{:.6}{}}}",
                s.entries_scanned, s.files_copied, s.bytes_copied, s.files_deleted, s.dirs_created, s.unchanged, s.errors, s.elapsed_s,
                tail
            );
            let _ = out.flush();
        } else {
            let _ = out.flush();
            drop(out);
            let mut x = String::new();
            for (_, k, v, shown) in extra {
                if *shown {
                    x.push_str(&format!(", {v} {}", plural(*v, k)));
                }
            }
            let d = &s.delta;
            if d.files > 0 || d.fallbacks > 0 {
                x.push_str(&format!(
                    ", {} by delta ({} literal, {} matched, {} on the wire{})",
                    d.files,
                    human_bytes(d.literal),
                    human_bytes(d.matched),
                    human_bytes(d.wire),
                    if d.fallbacks > 0 {
                        format!(", {} sent whole after a failed delta", d.fallbacks)
                    } else {
                        String::new()
                    }
                ));
            }
            eprintln!(
                "ferry summary: {}{} scanned, {} copied ({}), {} deleted, {} {} created{x}, {} unchanged, {} {} in {:.2} s",
                if self.dry_run { "(dry run) " } else { "" },
                s.entries_scanned,
                s.files_copied,
                human_bytes(s.bytes_copied),
                s.files_deleted,
                s.dirs_created,
                plural(s.dirs_created, "dirs"),
                s.unchanged,
                s.errors,
                plural(s.errors, "errors"),
                s.elapsed_s
            );
        }
    }
}

impl CliReporter {
    /// What pruning kept versions did after a run (`--versions` with a
    /// retention policy) in the replica `root`: its problems as notes,
    /// then one line (a `versions_pruned` record with `--json`) when
    /// versions were removed.
    pub fn versions_pruned(&self, root: &str, r: &ferry_engine::versions::PruneReport) {
        for n in &r.notes {
            Reporter::note(self, &format!("{root}: {n}"));
        }
        if r.pruned == 0 {
            return;
        }
        if self.json {
            let mut line = b"{\"type\":\"versions_pruned\",\"root\":".to_vec();
            json_string(&mut line, root);
            let _ = writeln!(
                line,
                ",\"pruned\":{},\"bytes\":{},\"kept\":{}}}",
                r.pruned, r.bytes, r.kept
            );
            let _ = self.out.lock().write_all(&line);
        } else {
            let root = text_name_string(root.as_bytes());
            self.with_bar_suspended(|| {
                eprintln!(
                    "ferry: versions: pruned {} version{} ({} bytes) in {root}, {} kept",
                    r.pruned,
                    if r.pruned == 1 { "" } else { "s" },
                    r.bytes,
                    r.kept
                )
            });
        }
    }
}

impl Reporter for CliReporter {
    fn shows_actions(&self) -> bool {
        self.json || self.lines
    }

    fn action(&self, action: Action, path: &[u8], size: u64) {
        // Skips come through `skip`, with their reason.
        if self.json {
            let mut line = Vec::with_capacity(64 + path.len());
            line.extend_from_slice(b"{\"type\":\"");
            line.extend_from_slice(action.as_str().as_bytes());
            line.extend_from_slice(b"\",");
            json_name(&mut line, "path", if path.is_empty() { b"." } else { path });
            let _ = writeln!(line, ",\"size\":{size}}}");
            let _ = self.out.lock().write_all(&line);
        } else if self.lines {
            let mut line = Vec::with_capacity(16 + path.len());
            line.extend_from_slice(action.as_str().as_bytes());
            line.push(b' ');
            text_name(&mut line, if path.is_empty() { b"." } else { path });
            line.push(b'\n');
            self.with_bar_suspended(|| {
                let _ = self.out.lock().write_all(&line);
            });
        }
    }

    /// `hardlink PATH -> FIRST` with -v (` -> ` appears in a name only
    /// escaped), a `hardlink` record with the first name as `"target"`.
    fn hard_link(&self, path: &[u8], to: &[u8]) {
        self.pair_line("hardlink", path, "target", to, 0);
    }

    /// `keep PATH -> WHERE` with -v (` -> ` appears in a name only
    /// escaped), a `keep` record with where it went as `"to"`.
    fn kept(&self, path: &[u8], to: &[u8], size: u64) {
        if !self.dry_run {
            self.note_kept(0, to);
        }
        self.pair_line("keep", path, "to", to, size);
    }

    /// `rename PATH <- FROM` with -v (as bisync's), a `rename` record with
    /// the old name as `"from"`.
    fn renamed(&self, path: &[u8], from: &[u8]) {
        self.pair_line_sep("rename", path, "from", from, 0, b" <- ");
    }

    fn note(&self, msg: &str) {
        let msg = text_name_string(msg.as_bytes());
        self.with_bar_suspended(|| eprintln!("ferry: note: {msg}"));
    }

    fn skip(&self, path: &[u8], why: &str) {
        let path: &[u8] = if path.is_empty() { b"." } else { path };
        let p = text_name_string(path);
        let why_text = text_name_string(why.as_bytes());
        self.with_bar_suspended(|| eprintln!("ferry: skipped {p} ({why_text})"));
        if self.json {
            let mut line = Vec::with_capacity(64 + path.len() + why.len());
            line.extend_from_slice(b"{\"type\":\"skip\",");
            json_name(&mut line, "path", path);
            line.extend_from_slice(b",\"size\":0,\"reason\":");
            json_string(&mut line, why);
            line.extend_from_slice(b"}\n");
            let _ = self.out.lock().write_all(&line);
        } else if self.lines {
            let mut line = b"skip ".to_vec();
            text_name(&mut line, path);
            line.push(b'\n');
            self.with_bar_suspended(|| {
                let _ = self.out.lock().write_all(&line);
            });
        }
    }

    fn error(&self, path: &[u8], err: &io::Error) {
        let p = if path.is_empty() { b"." } else { path };
        let c = cause(err);
        // An error met reading the source of a copy names its side (a
        // path names DST's entry otherwise): `ferry: SRC: PATH: open: ...`.
        // So does a full disk: `ferry: DST: PATH: write: no space left on
        // device: needs ..., ... free`.
        use ferry_engine::store::End;
        let side_op = match ferry_engine::store::op_of(err) {
            Some((Some(End::Src), op)) => Some(("SRC", op)),
            Some((Some(End::Dst), op @ "write")) => Some(("DST", op)),
            _ => None,
        };
        let line = match side_op {
            Some((side, op)) => format!(
                "ferry: {side}: {}: {}",
                text_name_string(p),
                text_name_string(format!("{op}: {c}").as_bytes())
            ),
            None => error_line(p, &c),
        };
        self.with_bar_suspended(|| eprintln!("{line}"));
        if self.json {
            let mut line = Vec::new();
            line.extend_from_slice(b"{\"type\":\"error\",");
            if let Some((side, op)) = side_op {
                line.extend_from_slice(format!("\"side\":\"{side}\",\"op\":").as_bytes());
                json_string(&mut line, op);
                line.push(b',');
            }
            json_name(&mut line, "path", path);
            line.extend_from_slice(b",\"error\":");
            json_string(&mut line, &c);
            line.extend_from_slice(b"}\n");
            let _ = self.out.lock().write_all(&line);
        }
    }
}

/// Reports what a run reports (copy, sync or bisync), except the errors of
/// requests refused because an S3 endpoint was declared unreachable or an
/// SSH or SFTP connection was lost: those make one line at the end instead
/// of one line per entry (they stay counted in the summary's errors).
///
/// The line says the run stopped and that a rerun finishes it, with no
/// count of what is left: the entries that failed are only those reached
/// before the loss (a scan cut short never saw the rest), so their number
/// is not what a rerun has to do.
pub struct Unreachable<'a> {
    inner: &'a CliReporter,
    why: std::sync::OnceLock<String>,
}

impl<'a> Unreachable<'a> {
    pub fn new(inner: &'a CliReporter) -> Self {
        Unreachable {
            inner,
            why: std::sync::OnceLock::new(),
        }
    }

    /// True when `err` is one of those requests (or of a lost SSH or SFTP
    /// connection): not shown, told once by [`Unreachable::finish`].
    fn swallowed(&self, err: &io::Error) -> bool {
        if ferry_engine::class::classify(err) != ferry_engine::class::Class::Unavailable {
            return false;
        }
        let _ = self.why.set(cause(err));
        true
    }

    /// The one line, if the endpoint was declared unreachable or the
    /// connection lost.
    pub fn finish(&self) {
        if let Some(why) = self.why.get() {
            let line = stopped_line(why);
            self.inner.with_bar_suspended(|| eprintln!("{line}"));
        }
    }
}

/// The line of a run stopped by `why` (an endpoint unreachable, a
/// connection lost): no count of what is left, which is not known.
fn stopped_line(why: &str) -> String {
    format!(
        "ferry: {}; stopped; rerun to finish",
        text_name_string(why.as_bytes())
    )
}

impl Reporter for Unreachable<'_> {
    fn action(&self, action: Action, path: &[u8], size: u64) {
        self.inner.action(action, path, size)
    }

    fn skip(&self, path: &[u8], why: &str) {
        Reporter::skip(self.inner, path, why)
    }

    fn hard_link(&self, path: &[u8], to: &[u8]) {
        self.inner.hard_link(path, to)
    }

    fn kept(&self, path: &[u8], to: &[u8], size: u64) {
        self.inner.kept(path, to, size)
    }

    fn renamed(&self, path: &[u8], from: &[u8]) {
        self.inner.renamed(path, from)
    }

    fn note(&self, msg: &str) {
        Reporter::note(self.inner, msg)
    }

    fn shows_actions(&self) -> bool {
        self.inner.shows_actions()
    }

    fn error(&self, path: &[u8], err: &io::Error) {
        if !self.swallowed(err) {
            Reporter::error(self.inner, path, err)
        }
    }
}

impl ferry_bisync::BiReporter for Unreachable<'_> {
    fn action(
        &self,
        act: ferry_bisync::BiAction,
        on: ferry_bisync::Side,
        path: &[u8],
        other: Option<&[u8]>,
        size: u64,
    ) {
        ferry_bisync::BiReporter::action(self.inner, act, on, path, other, size)
    }

    fn error(&self, path: &[u8], err: &io::Error) {
        if !self.swallowed(err) {
            ferry_bisync::BiReporter::error(self.inner, path, err)
        }
    }

    fn error_on(&self, on: ferry_bisync::Side, path: &[u8], err: &io::Error) {
        if !self.swallowed(err) {
            ferry_bisync::BiReporter::error_on(self.inner, on, path, err)
        }
    }

    fn skip(&self, on: ferry_bisync::Side, path: &[u8], why: &str) {
        ferry_bisync::BiReporter::skip(self.inner, on, path, why)
    }

    fn note(&self, msg: &str) {
        ferry_bisync::BiReporter::note(self.inner, msg)
    }
}

/// The counters of the run under way, for the summary of a run refused
/// after it started counting.
static RUN_STATS: std::sync::OnceLock<Arc<Stats>> = std::sync::OnceLock::new();

/// Make `stats` the counters a refusal's summary reports.
pub fn track_stats(stats: &Arc<Stats>) {
    let _ = RUN_STATS.set(stats.clone());
}

/// With `--json`, the summary line of a run refused with `reason` (exit 2):
/// the counters so far (zero if it stopped before counting) and
/// `"refused":REASON`.
pub fn refused_summary(dry_run: bool, bisync: bool, elapsed: Duration, reason: &str) {
    let s = match RUN_STATS.get() {
        Some(st) => st.summary(elapsed),
        None => Summary {
            elapsed_s: elapsed.as_secs_f64(),
            ..Summary::default()
        },
    };
    let mut rep = CliReporter::new(true, false, dry_run);
    rep.refused = Some(reason.to_owned());
    if bisync {
        rep.write_summary(
            &s,
            &[
                ("renamed", "renamed", 0, true),
                ("conflicts", "conflicts", 0, true),
                ("kept", "kept", 0, false),
                ("bytes_kept", "bytes kept", 0, false),
            ],
        );
    } else {
        rep.summary(&s);
    }
}

impl CliReporter {
    /// The last line of a bisync: like copy/sync's, plus renames and conflicts.
    pub fn bisync_summary(&self, o: &ferry_bisync::Outcome, delta: ferry_engine::delta::Figures) {
        self.bisync_line(o, delta, None);
    }

    /// After each run of `bisync --watch`: with `--json` its summary line,
    /// `"scoped":1` for a run of the directories that changed, 0 for a
    /// whole one (with -v the text summary).
    pub fn watch_summary(&self, o: &ferry_bisync::Outcome, scoped: bool) {
        if self.json || self.lines {
            self.bisync_line(o, Default::default(), Some(scoped));
        }
    }

    fn bisync_line(
        &self,
        o: &ferry_bisync::Outcome,
        delta: ferry_engine::delta::Figures,
        scoped: Option<bool>,
    ) {
        let s = Summary {
            entries_scanned: o.entries_scanned,
            files_copied: o.files_copied,
            bytes_copied: o.bytes_copied,
            files_deleted: o.files_deleted,
            dirs_created: o.dirs_created,
            unchanged: o.unchanged,
            errors: o.errors,
            elapsed_s: o.elapsed_s,
            delta,
            ..Summary::default()
        };
        let mut extra = vec![
            ("renamed", "renamed", o.renamed, true),
            ("conflicts", "conflicts", o.conflicts, true),
            ("kept", "kept", o.kept, o.kept > 0),
            ("bytes_kept", "bytes kept", o.bytes_kept, false),
        ];
        if let Some(sc) = scoped {
            extra.push(("scoped", "scoped", sc as u64, false));
        }
        self.write_summary(&s, &extra);
    }
}

impl ferry_bisync::BiReporter for CliReporter {
    fn action(
        &self,
        act: ferry_bisync::BiAction,
        on: ferry_bisync::Side,
        path: &[u8],
        other: Option<&[u8]>,
        size: u64,
    ) {
        use ferry_bisync::BiAction;
        if act == BiAction::Keep && !self.dry_run {
            self.note_kept(on as usize, other.unwrap_or_default());
        }
        let p = if path.is_empty() { &b"."[..] } else { path };
        if self.json {
            let mut line = Vec::with_capacity(80 + path.len());
            line.extend_from_slice(b"{\"type\":\"");
            line.extend_from_slice(act.as_str().as_bytes());
            line.extend_from_slice(b"\",\"side\":\"");
            line.extend_from_slice(on.as_str().as_bytes());
            line.extend_from_slice(b"\",");
            json_name(&mut line, "path", p);
            if let Some(o) = other {
                line.push(b',');
                let key = match act {
                    BiAction::Rename => "from",
                    BiAction::Keep => "kept_to",
                    _ => "renamed_to",
                };
                json_name(&mut line, key, o);
            }
            let _ = writeln!(line, ",\"size\":{size}}}");
            let _ = self.out.lock().write_all(&line);
        } else if self.lines {
            // `ACTION SIDE PATH`, plus `<- OLD` for a rename and
            // `-> NAME` for the version a conflict moved aside.
            let mut line = Vec::with_capacity(24 + path.len());
            line.extend_from_slice(act.as_str().as_bytes());
            line.push(b' ');
            line.extend_from_slice(on.as_str().as_bytes());
            line.push(b' ');
            text_name(&mut line, p);
            if let Some(o) = other {
                line.extend_from_slice(match act {
                    BiAction::Rename => b" <- ",
                    _ => b" -> ",
                });
                text_name(&mut line, o);
            }
            line.push(b'\n');
            self.with_bar_suspended(|| {
                let _ = self.out.lock().write_all(&line);
            });
        }
    }

    fn error(&self, path: &[u8], err: &io::Error) {
        Reporter::error(self, path, err)
    }

    /// `ferry: SIDE: PATH: OP: cause` (the operation where the error
    /// names it), and an `error` object with `side` (and `op`) with
    /// `--json`.
    fn error_on(&self, on: ferry_bisync::Side, path: &[u8], err: &io::Error) {
        let p = if path.is_empty() { &b"."[..] } else { path };
        let c = cause(err);
        let op = ferry_engine::store::op_of(err).map(|(_, op)| op);
        let shown = match op {
            Some(op) => format!("{op}: {c}"),
            None => c.clone(),
        };
        let line = format!(
            "ferry: {}: {}: {}",
            on.as_str(),
            text_name_string(p),
            text_name_string(shown.as_bytes())
        );
        self.with_bar_suspended(|| eprintln!("{line}"));
        if self.json {
            let mut line = Vec::new();
            line.extend_from_slice(b"{\"type\":\"error\",\"side\":\"");
            line.extend_from_slice(on.as_str().as_bytes());
            line.extend_from_slice(b"\",");
            json_name(&mut line, "path", path);
            if let Some(op) = op {
                line.extend_from_slice(b",\"op\":");
                json_string(&mut line, op);
            }
            line.extend_from_slice(b",\"error\":");
            json_string(&mut line, &c);
            line.extend_from_slice(b"}\n");
            let _ = self.out.lock().write_all(&line);
        }
    }

    /// `ferry: skipped SIDE PATH: WHY` on stderr (never silent, not an
    /// error), and a `skip` object with `--json`.
    fn skip(&self, on: ferry_bisync::Side, path: &[u8], why: &str) {
        let p = if path.is_empty() { &b"."[..] } else { path };
        let ps = text_name_string(p);
        self.with_bar_suspended(|| eprintln!("ferry: skipped {} {ps}: {why}", on.as_str()));
        if self.json {
            let mut line = Vec::with_capacity(80 + path.len() + why.len());
            line.extend_from_slice(b"{\"type\":\"skip\",\"side\":\"");
            line.extend_from_slice(on.as_str().as_bytes());
            line.extend_from_slice(b"\",");
            json_name(&mut line, "path", p);
            line.extend_from_slice(b",\"reason\":");
            json_string(&mut line, why);
            line.extend_from_slice(b",\"size\":0}\n");
            let _ = self.out.lock().write_all(&line);
        }
    }

    fn note(&self, msg: &str) {
        // Notes name roots and paths: escaped like every other line.
        let msg = text_name_string(msg.as_bytes());
        self.with_bar_suspended(|| eprintln!("ferry: {msg}"));
    }
}

/// A plural noun (`dirs`, `errors`, `conflicts`) in the singular for 1;
/// words that do not end in `s` (`renamed`) are left alone.
fn plural(n: u64, word: &str) -> &str {
    match word.strip_suffix('s') {
        Some(one) if n == 1 => one,
        _ => word,
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The progress display: a thread that redraws from the counters a few
/// times a second (the UI's own clock, never on the data path).
pub struct Progress {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<()>,
}

impl Progress {
    pub fn start(stats: Arc<Stats>, rep: &CliReporter) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(8));
        bar.set_style(
            ProgressStyle::with_template("{spinner} {bytes}/{total_bytes} {bytes_per_sec} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        *rep.bar.lock() = Some(bar.clone());
        let (tx, rx) = mpsc::channel::<()>();
        let handle = std::thread::spawn(move || loop {
            let g = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            bar.set_length(g(&stats.bytes_planned));
            // Bytes as they move, not as files complete (a run that does
            // not count them as they move still counts finished files).
            bar.set_position(g(&stats.bytes_moved).max(g(&stats.bytes_copied)));
            // What --backup-dir/--suffix/--versions kept, beside what
            // was replaced or deleted (only when something was).
            let kept = match g(&stats.files_kept) {
                0 => String::new(),
                n => format!(", {n} kept ({})", human_bytes(g(&stats.bytes_kept))),
            };
            bar.set_message(format!(
                "{}/{} files, {} scanned, {} deleted{kept}, {} errors",
                g(&stats.files_copied),
                g(&stats.files_planned),
                g(&stats.entries_scanned),
                g(&stats.files_deleted),
                g(&stats.errors)
            ));
            match rx.recv_timeout(Duration::from_millis(125)) {
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                _ => {
                    bar.finish_and_clear();
                    return;
                }
            }
        });
        Progress { stop: tx, handle }
    }

    pub fn finish(self) {
        let _ = self.stop.send(());
        let _ = self.handle.join();
    }
}
