//! `ferry versions PATH` and `ferry restore PATH [--at TIME]`, and the
//! pruning of kept versions after each run with `--versions` (see
//! `ferry_engine::versions` for the policy and docs/CLI.md, "Versions").
//!
//! PATH is anywhere in a replica: its root is the nearest directory above
//! PATH (or PATH itself) that holds `.ferry-versions`, found locally with
//! a stat per level, over ssh/sftp with one remote stat per level, on S3
//! with one listing per level.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use ferry_backends::local::absolute;
use ferry_backends::{local_root, AnyDir, AnyStore, Backends, Location, Opts, Root};
use ferry_engine::copy::{Copier, FileCopy};
use ferry_engine::encode::{json_name, json_string, text_name_string};
use ferry_engine::keep::{split_parent, KeepBase, KeepRule, Keeper, VERSIONS_DIR};
use ferry_engine::store::{Planned, StoreExt};
use ferry_engine::versions::{collect, keeps_all, open_versions_dir, spans, state_at, Version};
use ferry_engine::{Kind, Listing, Meta, Store};
use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::Timestamp;

use crate::args::{now_unix, KeepArgs, RestoreArgs, VersionsArgs};
use crate::output::{cause, CliReporter};

mod at;
mod find;
mod history;
mod restore;
mod show;

use at::*;
use find::*;
use history::*;
pub use restore::run_restore;
pub use show::run_versions;

/// Prune the versions of each replica in `roots` after a run with
/// `--versions` and a retention policy (none for a dry run). Never fails:
/// problems are notes.
pub fn after_run(
    reg: &Backends,
    roots: &[&Root],
    keep: &KeepArgs,
    dry_run: bool,
    rep: &CliReporter,
) {
    let r = keep.retention();
    if !keep.versions || dry_run || keeps_all(&r) {
        return;
    }
    let now = now_unix();
    for root in roots {
        let o = Opts {
            jobs: 4,
            lazy_meta: true,
            walk: false,
        };
        let report = match reg.open(root, &o) {
            Ok(s) => ferry_engine::versions::prune(&s, now, &r),
            Err(e) => ferry_engine::versions::PruneReport {
                notes: vec![format!("pruning versions: {e}")],
                ..Default::default()
            },
        };
        rep.versions_pruned(&root.id(), &report);
    }
}

/// Prune the versions a watch's run kept: in the directories `dirs` of
/// each replica's `.ferry-versions` ((index in `roots`, path below it)),
/// not their subdirectories. Never fails: problems are notes.
pub fn after_run_in(
    reg: &Backends,
    roots: &[&Root],
    keep: &KeepArgs,
    dirs: &[(usize, Vec<u8>)],
    rep: &CliReporter,
) {
    let r = keep.retention();
    if !keep.versions || keeps_all(&r) {
        return;
    }
    let now = now_unix();
    for (i, root) in roots.iter().enumerate() {
        let subs: Vec<Vec<u8>> = dirs
            .iter()
            .filter(|(s, _)| *s == i)
            .map(|(_, d)| d.clone())
            .collect();
        if subs.is_empty() {
            continue;
        }
        let o = Opts {
            jobs: 4,
            lazy_meta: true,
            walk: false,
        };
        let report = match reg.open(root, &o) {
            Ok(s) => ferry_engine::versions::prune_in(&s, now, &r, &subs),
            Err(e) => ferry_engine::versions::PruneReport {
                notes: vec![format!("pruning versions: {e}")],
                ..Default::default()
            },
        };
        rep.versions_pruned(&root.id(), &report);
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
pub(super) fn utc(unix: i64) -> String {
    match Timestamp::from_second(unix) {
        Ok(t) => t.strftime("%Y-%m-%d %H:%M:%S").to_string(),
        Err(_) => unix.to_string(),
    }
}

/// The location of `rel` below `root`, as a user writes it (escaped as
/// text output escapes names).
pub(super) fn location(root: &Root, rel: &[u8]) -> String {
    root.location_text(rel)
}

pub(super) fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a name"))
}

pub(super) fn missing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}
