//! `ferry versions`: the table, or one JSON object per version.

use super::*;

/// `YYYY-MM-DDTHH:MM:SSZ`.
pub(super) fn utc_json(unix: i64) -> String {
    format!("{}Z", utc(unix).replace(' ', "T"))
}

/// One version as a JSON object: paths as the other JSON outputs give
/// names (a string; with `KEY_bytes` in base64 when not UTF-8).
pub(super) fn json_line(out: &mut Vec<u8>, root: &Root, h: &History, i: usize) {
    let v = &h.versions[i];
    let written = h.written(Pick::Version(i));
    out.extend_from_slice(b"{\"type\":\"version\",");
    json_name(out, "path", &v.rel());
    out.extend_from_slice(b",\"kept\":");
    json_string(out, &utc_json(v.kept));
    out.extend_from_slice(b",\"written\":");
    json_string(out, &utc_json(written));
    let _ = write!(
        out,
        ",\"kept_unix\":{},\"written_unix\":{written},\"size\":{},\"mtime_ns\":{},\"mode\":{},\"deleted\":{},",
        v.kept,
        v.meta.size,
        v.meta.mtime_ns(),
        v.meta.mode,
        h.live.is_none()
    );
    json_name(out, "where", &h.where_bytes(root, Pick::Version(i)));
    out.push(b',');
    json_name(out, "root", &root.location(b""));
    out.extend_from_slice(b"}\n");
}

/// The state of a file at `--at`, as a JSON object.
pub(super) fn json_state(out: &mut Vec<u8>, root: &Root, h: &History, p: Pick) {
    let m = h.meta(p);
    out.extend_from_slice(b"{\"type\":\"state\",");
    json_name(out, "path", &h.rel);
    let state = match (p, &h.live) {
        (Pick::Live, _) => "current",
        (_, Some(_)) => "changed",
        (_, None) => "deleted",
    };
    let written = h.written(p);
    let _ = write!(
        out,
        ",\"state\":\"{state}\",\"written_unix\":{written},\"size\":{},\"mtime_ns\":{},",
        m.size,
        m.mtime_ns()
    );
    json_name(out, "where", &h.where_bytes(root, p));
    out.extend_from_slice(b"}\n");
}

/// Columns padded to their widest cell, two spaces apart, the last one
/// as it is; the first row is the header.
pub(super) fn table(out: &mut Vec<u8>, rows: &[Vec<String>], right: &[bool]) {
    let n = rows.first().map_or(0, Vec::len);
    let mut w = vec![0; n];
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n.saturating_sub(1)) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == n {
                line.push_str(c);
            } else {
                let pad = w[i] - c.chars().count();
                if right.get(i).copied().unwrap_or(false) {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(c);
                } else {
                    line.push_str(c);
                    line.push_str(&" ".repeat(pad));
                }
                line.push_str("  ");
            }
        }
        let _ = writeln!(out, "{line}");
    }
}

/// `ferry versions PATH [--at TIME] [--json]`.
pub fn run_versions(a: VersionsArgs, reg: &Backends) -> Result<u8, String> {
    let now = now_unix();
    let tz = TimeZone::system();
    let at = a.at.as_deref().map(|s| parse_at(s, now, &tz)).transpose()?;
    let suffix = a.suffix.as_deref().unwrap_or("").as_bytes().to_vec();
    let backup = a.backup_dir.as_deref().map(|d| (d, suffix.as_slice()));
    let (rep, _store, t, _bk) = lookup(reg, &a.path, backup)?;
    let mut out = Vec::new();
    let (files, one): (Vec<History>, bool) = match t {
        Target::File(h) => (vec![h], true),
        Target::Dir { files, .. } => (files.into_values().collect(), false),
    };
    let v = View {
        root: &rep.root,
        json: a.json,
        tz: &tz,
    };
    match (at, one, &files[..]) {
        (Some(at), _, _) => v.at(&mut out, &files, at, &rep.rel),
        (None, true, [h]) => v.one(&mut out, h),
        _ => v.below(&mut out, &files, &rep.rel),
    }
    let mut so = io::stdout().lock();
    match so.write_all(&out).and_then(|()| so.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(format!("stdout: {}", cause(&e))),
        _ => Ok(0),
    }
}

/// How `ferry versions` shows a replica's histories.
struct View<'a> {
    root: &'a Root,
    json: bool,
    tz: &'a TimeZone,
}

impl View<'_> {
    fn local(&self, t: i64) -> String {
        local_time(t, self.tz)
    }

    /// Each file as it was at `at` (`rel`: PATH below the root).
    fn at(&self, out: &mut Vec<u8>, files: &[History], at: i64, rel: &[u8]) {
        let root = self.root;
        let mut rows = vec![vec![
            "STATE".to_string(),
            "WRITTEN".into(),
            "SIZE".into(),
            "PATH".into(),
        ]];
        let mut any = false;
        for h in files {
            let Some(p) = h.pick(Some(at)) else { continue };
            any = true;
            if self.json {
                json_state(out, root, h, p);
                continue;
            }
            let state = match (p, &h.live) {
                (Pick::Live, _) => "current",
                (_, Some(_)) => "changed",
                (_, None) => "deleted",
            };
            rows.push(vec![
                state.into(),
                self.local(h.written(p)),
                h.meta(p).size.to_string(),
                location(root, &h.rel),
            ]);
        }
        if !any {
            eprintln!(
                "ferry: nothing of {} existed at {} (as far as its versions tell)",
                location(root, rel),
                self.local(at)
            );
        } else if !self.json {
            table(out, &rows, &[false, false, true]);
        }
    }

    /// One file's versions, newest first: the current file, then each
    /// version with the span it held.
    fn one(&self, out: &mut Vec<u8>, h: &History) {
        let root = self.root;
        if h.versions.is_empty() {
            eprintln!("ferry: no versions of {} kept", location(root, &h.rel));
            return;
        }
        if self.json {
            for i in (0..h.versions.len()).rev() {
                json_line(out, root, h, i);
            }
            return;
        }
        let mut rows = vec![vec![
            "WRITTEN".to_string(),
            "REPLACED".into(),
            "SIZE".into(),
            "VERSION".into(),
        ]];
        if let Some(m) = &h.live {
            rows.push(vec![
                self.local(h.written(Pick::Live)),
                "(current)".into(),
                m.size.to_string(),
                location(root, &h.rel),
            ]);
        }
        for (i, v) in h.versions.iter().enumerate().rev() {
            rows.push(vec![
                self.local(h.written(Pick::Version(i))),
                self.local(v.kept),
                v.meta.size.to_string(),
                h.where_text(root, Pick::Version(i)),
            ]);
        }
        table(out, &rows, &[false, false, true]);
    }

    /// Every file below a directory (`rel`) that has versions.
    fn below(&self, out: &mut Vec<u8>, files: &[History], rel: &[u8]) {
        let root = self.root;
        let with: Vec<&History> = files.iter().filter(|h| !h.versions.is_empty()).collect();
        if with.is_empty() {
            eprintln!("ferry: no versions kept below {}", location(root, rel));
            return;
        }
        if self.json {
            for h in with {
                for i in (0..h.versions.len()).rev() {
                    json_line(out, root, h, i);
                }
            }
            return;
        }
        let mut rows = vec![vec![
            "LAST REPLACED".to_string(),
            "VERSIONS".into(),
            "NOW".into(),
            "PATH".into(),
        ]];
        for h in with {
            let newest = h.versions.iter().map(|v| v.kept).max().unwrap_or(0);
            rows.push(vec![
                self.local(newest),
                h.versions.len().to_string(),
                if h.live.is_some() {
                    "present"
                } else {
                    "deleted"
                }
                .into(),
                location(root, &h.rel),
            ]);
        }
        table(out, &rows, &[false, true, false]);
    }
}
