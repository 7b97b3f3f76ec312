//! Where `--backup-dir DIR` is, for a destination: a path the destination
//! store itself can move entries to (see `ferry_engine::keep`).
//!
//! - A relative `DIR` is relative to the destination's root (rsync's rule;
//!   rclone's `--backup-dir` is a full remote path, which ferry takes too).
//!   Inside the destination it is never synced; `../old` is beside it.
//! - An absolute path is on the destination's machine (local, or the ssh
//!   host); `s3://BUCKET/PREFIX` and `host:path` must name the
//!   destination's own server (same endpoint; same host and port).
//! - Anything else is refused: keeping is a rename or a server-side copy,
//!   never a download.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use ferry_engine::keep::KeepBase;

use crate::{Error, Location, Root};

/// The base of `--backup-dir dir` for a destination rooted at `dst`.
pub fn keep_base(dst: &Root, dir: &OsStr) -> Result<KeepBase, Error> {
    base(dst, dir).map_err(Error::Refused)
}

fn base(dst: &Root, dir: &OsStr) -> Result<KeepBase, String> {
    let shown = dir.to_string_lossy();
    let other = || {
        format!(
            "--backup-dir {shown}: not on DST's backend ({}); ferry keeps files by a rename or a server-side copy, never a download: give a path relative to DST or on its server",
            dst.id()
        )
    };
    if dir.is_empty() {
        return Err("--backup-dir: empty path".to_string());
    }
    match Location::parse(dir) {
        Location::Local(p) if p.is_relative() => relative(dst, &p, &shown),
        Location::Local(p) => match dst {
            Root::Local(r) => Ok(match p.strip_prefix(r) {
                Ok(inside) if !inside.as_os_str().is_empty() => {
                    KeepBase::Root(inside.as_os_str().as_bytes().to_vec())
                }
                Ok(_) => {
                    return Err(format!(
                        "--backup-dir {shown}: is DST itself (give another directory)"
                    ))
                }
                Err(_) => KeepBase::Abs(p.as_os_str().as_bytes().to_vec()),
            }),
            Root::Shell(_) => Ok(KeepBase::Abs(p.as_os_str().as_bytes().to_vec())),
            Root::S3(_) => Err(other()),
        },
        Location::Url { text: url, .. } => match dst {
            Root::S3(c) => {
                let (bucket, prefix) = match ferry_s3::parse_s3_url(&url) {
                    Some(Ok(bp)) => bp,
                    _ => {
                        return Err(format!(
                            "--backup-dir {shown}: not an s3://BUCKET/PREFIX URL"
                        ))
                    }
                };
                let prefix = prefix.trim_matches('/');
                let pre = c.prefix.trim_matches('/');
                if bucket == c.bucket && (prefix == pre || pre.is_empty() && prefix.is_empty()) {
                    return Err(format!(
                        "--backup-dir {shown}: is DST itself (give another prefix)"
                    ));
                }
                if bucket == c.bucket && !pre.is_empty() && prefix.starts_with(&format!("{pre}/")) {
                    return Ok(KeepBase::Root(prefix.as_bytes()[pre.len() + 1..].to_vec()));
                }
                if bucket == c.bucket && pre.is_empty() {
                    return Ok(KeepBase::Root(prefix.as_bytes().to_vec()));
                }
                let mut b = bucket.into_bytes();
                if !prefix.is_empty() {
                    b.push(b'/');
                    b.extend_from_slice(prefix.as_bytes());
                }
                Ok(KeepBase::Abs(b))
            }
            _ => Err(other()),
        },
        Location::Shell { text, host, path } => match dst {
            Root::Shell(r) => {
                let b =
                    crate::SshRoot::of(&text, &host, &path, r.sftp).map_err(|e| e.to_string())?;
                if b.host != r.host || b.port != r.port {
                    return Err(other());
                }
                Ok(KeepBase::Abs(b.path))
            }
            _ => Err(other()),
        },
    }
}

/// A relative `--backup-dir` (`shown` as typed): below DST's root, or
/// (with `..`) beside it on DST's own server.
fn relative(dst: &Root, p: &Path, shown: &str) -> Result<KeepBase, String> {
    let (ups, rest) = normalize(p)
        .ok_or_else(|| format!("--backup-dir {shown}: is DST itself (give another directory)"))?;
    if ups == 0 {
        return Ok(KeepBase::Root(rest));
    }
    // Outside DST: from DST's own path, on its own server.
    let (root, sep): (Vec<u8>, u8) = match dst {
        Root::Local(r) => (r.as_os_str().as_bytes().to_vec(), b'/'),
        Root::S3(c) => {
            let mut b = c.bucket.as_bytes().to_vec();
            let pre = c.prefix.trim_matches('/');
            if !pre.is_empty() {
                b.push(b'/');
                b.extend_from_slice(pre.as_bytes());
            }
            (b, b'/')
        }
        Root::Shell(r) => (r.path.clone(), b'/'),
    };
    let mut parts: Vec<&[u8]> = root
        .split(|&c| c == sep)
        .filter(|s| !s.is_empty())
        .collect();
    let absolute = root.first() == Some(&b'/');
    let floor = usize::from(matches!(dst, Root::S3(_))); // the bucket stays
    for _ in 0..ups {
        if parts.len() <= floor {
            return Err(format!(
                "--backup-dir {shown}: goes above the top of DST ({})",
                dst.id()
            ));
        }
        parts.pop();
    }
    let mut out = Vec::new();
    if absolute {
        out.push(b'/');
    }
    out.extend_from_slice(&parts.join(&b'/'));
    if !rest.is_empty() {
        if !out.is_empty() && out.last() != Some(&b'/') {
            out.push(b'/');
        }
        out.extend_from_slice(&rest);
    }
    Ok(KeepBase::Abs(out))
}

/// A relative path's leading `..` count and the rest, `/`-joined, with `.`
/// dropped; `None` when it names the directory it is relative to.
fn normalize(p: &Path) -> Option<(usize, Vec<u8>)> {
    let mut ups = 0;
    let mut parts: Vec<&OsStr> = Vec::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    ups += 1;
                }
            }
            Component::Normal(n) => parts.push(n),
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    if ups == 0 && parts.is_empty() {
        return None;
    }
    let rest = parts
        .iter()
        .map(|s| s.as_bytes())
        .collect::<Vec<_>>()
        .join(&b'/');
    Some((ups, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn local(p: &str) -> Root {
        Root::Local(PathBuf::from(p))
    }

    #[test]
    fn relative_dirs_are_below_or_beside_dst() {
        let d = local("/data/dst");
        let kb = |s: &str| base(&d, OsStr::new(s));
        assert_eq!(kb("old"), Ok(KeepBase::Root(b"old".to_vec())));
        assert_eq!(kb("./a/../old/x"), Ok(KeepBase::Root(b"old/x".to_vec())));
        assert_eq!(kb("../old"), Ok(KeepBase::Abs(b"/data/old".to_vec())));
        assert_eq!(kb("../../old"), Ok(KeepBase::Abs(b"/old".to_vec())));
        assert!(kb(".").is_err() && kb("a/..").is_err());
        assert_eq!(kb("/data/dst/k"), Ok(KeepBase::Root(b"k".to_vec())));
        assert_eq!(kb("/backup"), Ok(KeepBase::Abs(b"/backup".to_vec())));
        assert!(kb("/data/dst").is_err());
        let e = kb("s3://b/p").unwrap_err();
        assert!(e.contains("not on DST's backend"), "{e}");
        assert!(kb("host:old").is_err());
    }
}
