//! Keeping an object a run replaces or removes (`--backup-dir`,
//! `--suffix`, `--versions`; see `ferry_engine::keep`): a server-side copy
//! to its kept key (CopyObject, or UploadPartCopy parts above 5 GiB), with
//! the object's own mtime, mode and MD5 metadata, then, when it is
//! removed rather than replaced, a DELETE of the original. No byte
//! travels through ferry. The kept key is below the store's prefix
//! (`KeepBase::Root`) or below `bucket/prefix` on the same endpoint with
//! the same credentials (`KeepBase::Abs`). S3 has no "copy unless it
//! exists" that every server honours: without `overwrite`, a HEAD of the
//! kept key comes first (the best an object store offers, as for
//! renames).

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_engine::keep::{KeepBase, KeepTo};

use crate::config::S3Config;
use crate::parse::check_key;
use crate::store::{S3Dir, S3Store};

/// Stores for the other buckets kept objects went to (by bucket name).
pub(crate) type Others = parking_lot::Mutex<HashMap<String, Arc<S3Store>>>;

fn utf8(b: &[u8]) -> io::Result<&str> {
    std::str::from_utf8(b).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "kept path is not UTF-8 (S3 keys must be)",
        )
    })
}

/// The key of the `/`-separated parts, in order, with `.` dropped and
/// `..` going up one segment (never above the bucket).
fn resolve(parts: &[&str]) -> io::Result<String> {
    let mut segs: Vec<&str> = Vec::new();
    for p in parts {
        for s in p.split('/') {
            match s {
                "" | "." => {}
                ".." => {
                    if segs.pop().is_none() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("kept path {:?} goes above the bucket", parts.join("/")),
                        ));
                    }
                }
                s => segs.push(s),
            }
        }
    }
    let key = segs.join("/");
    check_key(&key)?;
    Ok(key)
}

/// `bucket/prefix` split (`KeepBase::Abs` of S3).
fn bucket_of(base: &str) -> io::Result<(&str, &str)> {
    let base = base.trim_start_matches('/');
    let (bucket, prefix) = base.split_once('/').unwrap_or((base, ""));
    if bucket.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("kept location {base:?} names no bucket"),
        ));
    }
    Ok((bucket, prefix))
}

impl S3Store {
    /// See [`ferry_engine::store::Store::keep`] and the module's comment.
    pub(crate) fn keep_entry(&self, dir: &S3Dir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
        let from = self.key(dir, name)?;
        let path = utf8(to.path)?;
        match to.base {
            KeepBase::Root(b) => {
                let key = resolve(&[&self.root, utf8(b)?, path])?;
                self.keep_at(self, &from, &key, to)
            }
            KeepBase::Abs(b) => {
                let (bucket, prefix) = bucket_of(utf8(b)?)?;
                let key = resolve(&[prefix, path])?;
                if bucket == self.c.bucket.name() {
                    self.keep_at(self, &from, &key, to)
                } else {
                    let other = self.other_bucket(bucket)?;
                    self.keep_at(&other, &from, &key, to)
                }
            }
        }
    }

    /// Copy object `from` to `key` of `target` (this store, or one of
    /// another bucket on the same server), then delete `from` unless it
    /// is being replaced.
    fn keep_at(&self, target: &S3Store, from: &str, key: &str, to: &KeepTo<'_>) -> io::Result<()> {
        let same = std::ptr::eq(target, self) || target.c.bucket.name() == self.c.bucket.name();
        if same && from == key {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{from}: kept onto itself"),
            ));
        }
        if !to.overwrite && target.head_if_any(key)?.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: exists", target.c.url_of(key)),
            ));
        }
        // Moved away only while it is still the object planned: checked
        // before the copy, and its DELETE conditional (see `check`).
        // (The check's HEAD also gives what the copy needs.)
        let (cond, head) = match (to.replacing, &to.planned) {
            (false, Some(p)) => {
                let (tag, head) = self.planned_head(from, p)?;
                (crate::check::Cond::matching(tag), Some(head))
            }
            _ => (crate::check::Cond::Any, None),
        };
        // The object's own metadata goes with it (ferry's mtime and mode,
        // rclone's MD5); its size says whether one CopyObject will do.
        let (meta, md5) = match head {
            Some(h) => h,
            None => self.head_md5(from, 0, None)?,
        };
        target.copy_object(key, &self.source_of(from), meta.size, &meta, md5.as_deref())?;
        self.c
            .counters
            .server_copies
            .fetch_add(1, Ordering::Relaxed);
        if !to.replacing {
            self.conditional(&cond, |hs| self.delete_with(from, hs))?;
        }
        Ok(())
    }

    /// A store of `bucket` on this store's server, with its credentials
    /// (made once per bucket).
    fn other_bucket(&self, bucket: &str) -> io::Result<Arc<S3Store>> {
        let mut others = self.others.lock();
        if let Some(s) = others.get(bucket) {
            return Ok(s.clone());
        }
        let cfg = S3Config {
            bucket: bucket.to_string(),
            prefix: String::new(),
            ..(*self.cfg).clone()
        };
        let s = Arc::new(
            S3Store::new(&cfg, self.head_threads)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?,
        );
        others.insert(bucket.to_string(), s.clone());
        Ok(s)
    }

    /// True when `base` names a place this store can keep objects at.
    pub(crate) fn keep_base_ok(base: &KeepBase) -> bool {
        match base {
            KeepBase::Root(b) => std::str::from_utf8(b).is_ok(),
            KeepBase::Abs(b) => std::str::from_utf8(b).is_ok_and(|s| bucket_of(s).is_ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_keys_resolve_below_the_bucket() {
        assert_eq!(resolve(&["pre/", "old", "d/f"]).unwrap(), "pre/old/d/f");
        assert_eq!(resolve(&["pre/", "", "f~x"]).unwrap(), "pre/f~x");
        assert_eq!(resolve(&["a/b/", "../old", "f"]).unwrap(), "a/old/f");
        assert_eq!(resolve(&["", "./k", "f"]).unwrap(), "k/f");
        assert!(resolve(&["a/", "../../x", "f"]).is_err());
        assert_eq!(bucket_of("b/p/q").unwrap(), ("b", "p/q"));
        assert_eq!(bucket_of("b").unwrap(), ("b", ""));
        assert!(bucket_of("/").is_err());
        assert!(S3Store::keep_base_ok(&KeepBase::Abs(b"other/p".to_vec())));
        assert!(!S3Store::keep_base_ok(&KeepBase::Abs(b"".to_vec())));
        assert!(!S3Store::keep_base_ok(&KeepBase::Root(b"\xff".to_vec())));
    }
}
