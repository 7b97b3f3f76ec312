//! The check at the moment of the act (docs/CLI.md, "Checked at the act";
//! `ferry_engine::store::Planned`): right before a PUT, a
//! CompleteMultipartUpload or a CopyObject replaces an object the plan
//! saw, or a DELETE removes it, one HEAD checks that the object is still
//! the one planned (its size and mtime, or its ETag and LastModified); if
//! not, nothing is done to it ([`changed`]). The act is then sent with
//! `If-Match: <the ETag the HEAD saw>`, and a write onto a name the plan
//! saw free with `If-None-Match: *`: where the server honours them (AWS
//! S3, MinIO, moto) nothing written between the HEAD and the act is lost
//! either, and a name taken since is not written over (an HTTP 412,
//! taken as [`changed`]). Garage 2.5 ignores both headers: there the HEAD
//! is the check, with a window of one round trip, and a name planned free
//! is not checked. CopyObject is sent without a condition (the HEAD is its
//! check). A server that refuses the headers (501 `NotImplemented`) gets
//! its requests again without them, for the rest of the run.

use std::io;
use std::sync::atomic::Ordering;

use ferry_engine::entry::Meta;
use ferry_engine::store::{changed, Planned};
use rusty_s3::actions::{DeleteObject, HeadObject, PutObject};

use crate::parse::{header_mtime, md5_from_headers, meta_from_headers, parse_http_or_iso_date};
use crate::store::S3Store;
use crate::transport::is_precondition;

/// The condition an act on an object is sent with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cond {
    /// None (nothing was planned there: replace whatever is there).
    Any,
    /// The object still has this ETag (`If-Match`).
    Match(String),
    /// There is no object of that name (`If-None-Match: *`).
    Free,
}

impl Cond {
    /// The condition for a name that holds `p` (`Some`, checked by
    /// [`S3Store::planned_head`]) or that was planned free (`None`).
    pub(crate) fn of(store: &S3Store, key: &str, at: Option<&Planned>) -> io::Result<Cond> {
        Ok(match at {
            None => Cond::Free,
            Some(p) => Cond::matching(store.planned_head(key, p)?.0),
        })
    }

    /// `If-Match` on ETag `tag` (none when the server gave none).
    pub(crate) fn matching(tag: String) -> Cond {
        if tag.is_empty() {
            Cond::Any
        } else {
            Cond::Match(tag)
        }
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        match self {
            Cond::Any => Vec::new(),
            Cond::Match(tag) => vec![("if-match", tag.clone())],
            Cond::Free => vec![("if-none-match", "*".to_string())],
        }
    }
}

impl S3Store {
    /// The ETag (as the server gives it, quotes and all; empty when it
    /// gives none) of object `key` while it is still the entry planned
    /// `p`; otherwise [`changed`]. One HEAD (and a LIST of one key for an
    /// object with no mtime of ferry's that was planned from a HEAD's
    /// fallback time).
    /// With it, what the HEAD said of the object (its metadata and MD5, as
    /// [`S3Store::head_md5`] gives them), for an act that needs them too.
    pub(crate) fn planned_head(
        &self,
        key: &str,
        p: &Planned,
    ) -> io::Result<(String, (Meta, Option<String>))> {
        self.c.counters.heads.fetch_add(1, Ordering::Relaxed);
        let a = HeadObject::new(&self.c.bucket, self.c.creds(), key);
        let resp = match self.c.call("HEAD", key, a, &[], None) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(changed()),
            Err(e) => return Err(e),
        };
        let h = resp.headers();
        let etag = h
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let now = meta_from_headers(h, 0, None, key, &self.c.odd);
        let head = (now, md5_from_headers(h));
        if p.holds(Some(&now)) {
            return Ok((etag, head));
        }
        // Planned from a listing without a HEAD: its mtime is the
        // LastModified (to the millisecond on Garage, the HEAD has whole
        // seconds) and its version the fingerprint of that and the ETag.
        let lm = h
            .get("last-modified")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_http_or_iso_date);
        let (m, v) = (&p.meta, p.meta.version);
        if now.size != m.size || lm.is_none_or(|(s, _)| s != m.mtime_sec) {
            return Err(changed());
        }
        if v != 0 {
            let listed = crate::listing::version(Some(&etag), Some((m.mtime_sec, m.mtime_nsec)));
            return if listed == v {
                Ok((etag, head))
            } else {
                Err(changed())
            };
        }
        if header_mtime(h, key, &self.c.odd).is_none() {
            // A HEAD with the listing's LastModified as its time: the
            // listing tells it to the millisecond.
            if self.stat_key(key)?.is_some_and(|s| p.holds(Some(&s))) {
                return Ok((etag, head));
            }
        }
        Err(changed())
    }

    /// Run `act` with the headers of `cond`: a 412 (the condition did not
    /// hold) is [`changed`]; a server that refuses conditions gets `act`
    /// again without them, and no more conditions this run.
    pub(crate) fn conditional<T>(
        &self,
        cond: &Cond,
        act: impl Fn(&[(&'static str, String)]) -> io::Result<T>,
    ) -> io::Result<T> {
        let hs = if self.no_conditions.load(Ordering::Relaxed) {
            Vec::new()
        } else {
            cond.headers()
        };
        match act(&hs) {
            Err(e) if is_precondition(&e) => Err(changed()),
            Err(e) if !hs.is_empty() && e.kind() == io::ErrorKind::Unsupported => {
                self.no_conditions.store(true, Ordering::Relaxed);
                act(&[])
            }
            r => r,
        }
    }

    /// PUT `body` as object `key` with `meta`, and the headers `extra`.
    pub(crate) fn put_with(
        &self,
        key: &str,
        body: &[u8],
        meta: &ferry_engine::entry::Meta,
        extra: &[(&'static str, String)],
    ) -> io::Result<()> {
        let a = PutObject::new(&self.c.bucket, self.c.creds(), key);
        let mut hs = Self::meta_headers(meta, None);
        hs.extend(extra.iter().cloned());
        self.c.call("PUT", key, a, &hs, Some(body))?;
        Ok(())
    }

    /// DELETE object `key` with the headers `extra`.
    pub(crate) fn delete_with(
        &self,
        key: &str,
        extra: &[(&'static str, String)],
    ) -> io::Result<()> {
        let a = DeleteObject::new(&self.c.bucket, self.c.creds(), key);
        self.c.call("DELETE", key, a, extra, None)?;
        Ok(())
    }

    /// Delete object `key` only while it is still the entry planned `p`
    /// (see the module's comment).
    pub(crate) fn delete_planned(&self, key: &str, p: &Planned) -> io::Result<()> {
        let cond = Cond::of(self, key, Some(p))?;
        self.conditional(&cond, |hs| self.delete_with(key, hs))
    }
}
