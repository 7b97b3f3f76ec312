//! Multipart uploads: parts in parallel, resuming an interrupted upload
//! (ListMultipartUploads, ListParts), server-side copies in parts,
//! completion, abort and `ferry cleanup`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::etag;
use ferry_engine::bwlimit::Limiter;
use ferry_engine::entry::Meta;
use ferry_engine::store::SourceFile;
use md5::{Digest, Md5};
use rusty_s3::actions::{
    AbortMultipartUpload, CompleteMultipartUpload, CreateMultipartUpload, ListParts, PutObject,
    UploadPart,
};
use rusty_s3::S3Action;

use crate::fail::Unreachable;
use crate::parse::{base64, check_key, parse_http_or_iso_date};
use crate::store::{S3Store, S3Writer};
use crate::transport::{read_body, SIGN_TTL};
use crate::xml::{self, Parts};

/// Objects up to this size go up in one PUT; bigger ones in parts of this size.
pub const PART_SIZE: u64 = 8 << 20;

/// Parts of one object in flight at once.
pub(crate) const PART_CONCURRENCY: usize = 4;

pub(crate) struct Multipart {
    pub(crate) id: String,
    pub(crate) etags: Vec<String>,
    /// Base64 of the whole object's MD5, once every byte was read.
    pub(crate) md5: Option<String>,
    /// An interrupted upload taken over: its metadata may be stale.
    pub(crate) resumed: bool,
}

/// Largest object a single CopyObject may copy.
pub(crate) const COPY_MAX: u64 = 5 << 30;

/// Part size of server-side multipart copies.
pub(crate) const COPY_PART: u64 = 512 << 20;

/// The ETags of an upload's parts as its threads send them, and the first
/// failure.
#[derive(Default)]
struct PartTags {
    tags: Mutex<Vec<(u16, String)>>,
    failed: Mutex<Option<io::Error>>,
}

impl PartTags {
    fn done(&self, number: u16, etag: String) {
        self.tags.lock().push((number, etag));
    }

    fn fail(&self, e: io::Error) {
        self.failed.lock().get_or_insert(e);
    }

    fn failed(&self) -> bool {
        self.failed.lock().is_some()
    }

    /// The ETags in part order, or the first failure.
    fn finish(self) -> io::Result<Vec<String>> {
        if let Some(e) = self.failed.into_inner() {
            return Err(e);
        }
        let mut tags = self.tags.into_inner();
        tags.sort_by_key(|(n, _)| *n);
        Ok(tags.into_iter().map(|(_, t)| t).collect())
    }
}

impl S3Store {
    /// Start the multipart upload of `w` (object metadata goes here).
    /// `md5`: the object's `X-Amz-Meta-Md5chksum`, when known up front.
    pub(crate) fn create_upload(&self, w: &mut S3Writer, md5: Option<&str>) -> io::Result<()> {
        if w.upload.is_some() {
            return Ok(());
        }
        let a = CreateMultipartUpload::new(&self.c.bucket, self.c.creds(), &w.key);
        let hs = Self::meta_headers(&w.meta, md5);
        let mut resp = self.c.call("CreateMultipartUpload", &w.key, a, &hs, None)?;
        let body = read_body(&mut resp)?;
        let id = xml::upload_id(&body)
            .map_err(|e| io::Error::other(format!("CreateMultipartUpload {}: {e}", w.key)))?;
        w.upload = Some(Multipart {
            id,
            etags: Vec::new(),
            md5: None,
            resumed: false,
        });
        Ok(())
    }

    /// Send one part; returns its ETag.
    pub(crate) fn put_part(
        &self,
        key: &str,
        id: &str,
        number: u16,
        data: &[u8],
    ) -> io::Result<String> {
        self.c.counters.parts_sent.fetch_add(1, Ordering::Relaxed);
        let a = UploadPart::new(&self.c.bucket, self.c.creds(), key, number, id);
        let resp = self.c.call("UploadPart", key, a, &[], Some(data))?;
        resp.headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| io::Error::other(format!("UploadPart {key}: no ETag in the answer")))
    }

    /// Upload the rest of `src` as parts, `PART_CONCURRENCY` in flight: the
    /// calling thread reads parts in order while uploader threads send them.
    /// `first` is the first full part, already read.
    pub(crate) fn upload_parts(
        &self,
        w: &mut S3Writer,
        first: Vec<u8>,
        src: &mut dyn SourceFile,
        size: u64,
        chunk: usize,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        let prior_parts = self.start_or_resume(w)?;
        let id = w.upload.as_ref().expect("created").id.clone();
        let key = w.key.clone();
        let tags = PartTags::default();
        // The whole file's MD5, from the bytes as they are read (rclone's
        // `X-Amz-Meta-Md5chksum`, set at commit).
        let mut whole = Md5::new();
        whole.update(&first);
        let mut total = first.len() as u64;
        let (tx, rx) = std::sync::mpsc::sync_channel::<(u16, Vec<u8>)>(1);
        let rx = parking_lot::Mutex::new(rx);
        let read_result = std::thread::scope(|scope| -> io::Result<()> {
            // Owned here: dropping it when reading ends lets the uploaders finish.
            let tx = tx;
            for _ in 0..PART_CONCURRENCY {
                // After a failure every uploader keeps taking parts off the
                // queue (and drops them) until the reader stops: a reader
                // never waits on a queue nobody takes from.
                scope.spawn(|| loop {
                    let next = rx.lock().recv();
                    let Ok((n, data)) = next else { return };
                    if tags.failed() {
                        continue;
                    }
                    if let Some((size, tag)) = prior_parts.get(&n) {
                        if *size == data.len() as u64
                            && tag
                                .trim_matches('"')
                                .eq_ignore_ascii_case(&etag::md5_hex(&data))
                        {
                            self.c.counters.parts_reused.fetch_add(1, Ordering::Relaxed);
                            tags.done(n, tag.clone());
                            continue;
                        }
                    }
                    match self.put_part(&key, &id, n, &data) {
                        Ok(tag) => tags.done(n, tag),
                        Err(e) => tags.fail(e),
                    }
                });
            }
            let mut number = 1u16;
            let mut part = first;
            let mut buf = vec![0u8; chunk];
            loop {
                if tags.failed() {
                    return Ok(()); // `tags` says why
                }
                let full = part.len() >= PART_SIZE as usize;
                if full {
                    let next = part.split_off(PART_SIZE as usize);
                    if tx
                        .send((number, std::mem::replace(&mut part, next)))
                        .is_err()
                    {
                        return Ok(());
                    }
                    number += 1;
                    continue;
                }
                let n = src.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                if let Some(l) = limit {
                    l.acquire(n as u64);
                }
                total += n as u64;
                whole.update(&buf[..n]);
                part.extend_from_slice(&buf[..n]);
                if total > size {
                    break;
                }
            }
            if !part.is_empty() {
                let _ = tx.send((number, part));
            }
            Ok(())
        });
        let tags = tags.finish()?;
        read_result?;
        let up = w.upload.as_mut().expect("created");
        up.etags = tags;
        up.md5 = (total == size).then(|| base64(&whole.finalize()));
        Ok(total)
    }

    /// The multipart upload `w` writes: an earlier run's of this key taken
    /// over (its parts returned: number -> size and ETag), or a new one.
    fn start_or_resume(&self, w: &mut S3Writer) -> io::Result<Parts> {
        // An earlier run's upload of this key is taken over: each of its
        // parts whose size and MD5 match what we read is kept, not re-sent.
        // An upload that cannot be resumed, for whatever reason, is not a
        // reason to fail the file: it is started afresh.
        let prior = match self.resumable_upload(&w.key) {
            Ok(p) => p,
            Err(e) if Unreachable::is(&e) => return Err(e),
            Err(_) => None,
        };
        Ok(match prior {
            Some((id, parts)) => {
                self.c
                    .counters
                    .uploads_resumed
                    .fetch_add(1, Ordering::Relaxed);
                w.upload = Some(Multipart {
                    id,
                    etags: Vec::new(),
                    md5: None,
                    resumed: true,
                });
                parts
            }
            None => {
                self.create_upload(w, None)?;
                HashMap::new()
            }
        })
    }

    /// Abort an upload an interrupted run left behind (counted).
    fn abort_abandoned(&self, key: &str, id: &str) {
        self.abort_upload(key, id);
        self.c
            .counters
            .uploads_aborted
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn abort_upload(&self, key: &str, id: &str) {
        if check_key(key).is_err() {
            return;
        }
        let a = AbortMultipartUpload::new(&self.c.bucket, self.c.creds(), key, id);
        let _ = self.c.call("AbortMultipartUpload", key, a, &[], None);
    }

    /// Server-side copy of `source` (`/bucket/key`, `size` bytes) to `key`
    /// with `meta` as its metadata: one CopyObject up to 5 GiB, a multipart
    /// copy (UploadPartCopy, parts in parallel) above.
    pub(crate) fn copy_object(
        &self,
        key: &str,
        source: &str,
        size: u64,
        meta: &Meta,
        md5: Option<&str>,
    ) -> io::Result<()> {
        if size > COPY_MAX {
            return self.copy_multipart(key, source, size, meta, md5);
        }
        let a = PutObject::new(&self.c.bucket, self.c.creds(), key);
        let mut hs = Self::meta_headers(meta, md5);
        hs.push(("x-amz-copy-source", source.to_string()));
        hs.push(("x-amz-metadata-directive", "REPLACE".to_string()));
        let mut resp = self.c.call("COPY", key, a, &hs, None)?;
        // A copy can fail after the 200 status line: the error is in the body.
        let body = read_body(&mut resp)?;
        if let Some(e) = xml::error_body(&body) {
            return Err(self.c.status_error("COPY", key, 200, &e));
        }
        Ok(())
    }

    pub(crate) fn copy_multipart(
        &self,
        key: &str,
        source: &str,
        size: u64,
        meta: &Meta,
        md5: Option<&str>,
    ) -> io::Result<()> {
        let mut w = S3Writer::new(key.to_string(), meta);
        self.create_upload(&mut w, md5)?;
        let id = w.upload.as_ref().expect("created").id.clone();
        let parts = size.div_ceil(COPY_PART);
        let next = AtomicU64::new(0);
        let tags = PartTags::default();
        std::thread::scope(|scope| {
            for _ in 0..PART_CONCURRENCY.min(parts as usize) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= parts || tags.failed() {
                        return;
                    }
                    let (a, b) = (i * COPY_PART, ((i + 1) * COPY_PART).min(size) - 1);
                    let n = (i + 1) as u16;
                    let act = UploadPart::new(&self.c.bucket, self.c.creds(), key, n, &id);
                    let hs = [
                        ("x-amz-copy-source", source.to_string()),
                        ("x-amz-copy-source-range", format!("bytes={a}-{b}")),
                    ];
                    let r = self
                        .c
                        .call("UploadPartCopy", key, act, &hs, None)
                        .and_then(|mut resp| read_body(&mut resp))
                        .and_then(|body| {
                            xml::copy_part_etag(&body)
                                .map_err(|e| io::Error::other(format!("UploadPartCopy {key}: {e}")))
                        });
                    match r {
                        Ok(tag) => tags.done(n, tag),
                        Err(e) => {
                            tags.fail(e);
                            return;
                        }
                    }
                });
            }
        });
        match tags.finish() {
            Ok(tags) => self.complete(key, &id, &tags, &[]),
            Err(e) => {
                self.abort_upload(key, &id);
                Err(e)
            }
        }
    }

    /// Complete upload `id` of `key` from its parts' `etags`, sent with the
    /// headers `cond` (a condition: `crate::check::Cond`). A failed
    /// completion aborts the upload, unless only its condition was refused
    /// (`Unsupported`: sent again without it).
    pub(crate) fn complete(
        &self,
        key: &str,
        id: &str,
        etags: &[String],
        cond: &[(&'static str, String)],
    ) -> io::Result<()> {
        let complete = CompleteMultipartUpload::new(
            &self.c.bucket,
            self.c.creds(),
            key,
            id,
            etags.iter().map(String::as_str),
        );
        let url = complete.sign(SIGN_TTL);
        let body = complete.body();
        let r = self.c.send("CompleteMultipartUpload", key, || {
            let mut r = self.c.agent.post(url.as_str());
            for (k, v) in cond {
                r = r.header(*k, v.as_str());
            }
            r.send(body.as_bytes())
        });
        let refused = |e: &io::Error| !cond.is_empty() && e.kind() == io::ErrorKind::Unsupported;
        if r.as_ref().is_err_and(|e| !refused(e)) {
            self.abort_upload(key, id);
        }
        r.map(|_| ())
    }

    /// In-progress multipart uploads under `prefix`: (key, upload id,
    /// initiated), all pages.
    pub fn list_uploads(&self, prefix: &str) -> io::Result<Vec<(String, String, String)>> {
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        loop {
            let mut q: Vec<(&str, &str)> = vec![("uploads", ""), ("prefix", prefix)];
            if let Some((k, u)) = &markers {
                q.push(("key-marker", k));
                q.push(("upload-id-marker", u));
            }
            let url = self.sign_bucket_get(&q);
            let mut resp = self.c.send("ListMultipartUploads", prefix, || {
                self.c.agent.get(url.as_str()).call()
            })?;
            let body = read_body(&mut resp)?;
            let (page, next) = xml::uploads_page(&body)
                .map_err(|e| io::Error::other(format!("ListMultipartUploads {prefix}: {e}")))?;
            out.extend(page.into_iter().map(|u| (u.key, u.id, u.initiated)));
            match next {
                Some(m) => markers = Some(m),
                None => return Ok(out),
            }
        }
    }

    /// The parts of upload `id` on the server: number → (size, ETag).
    /// Read leniently: the `<Part>` elements of whatever root element the
    /// server answers with (moto's is `ListPartsResponse`).
    pub(crate) fn list_parts(&self, key: &str, id: &str) -> io::Result<Parts> {
        let mut parts = HashMap::new();
        let mut marker: Option<u16> = None;
        loop {
            let mut a = ListParts::new(&self.c.bucket, self.c.creds(), key, id);
            if let Some(m) = marker {
                a.set_part_number_marker(m);
            }
            let mut resp = self.c.call("ListParts", key, a, &[], None)?;
            let body = read_body(&mut resp)?;
            let (page, next) = xml::parts_page(&body)
                .map_err(|e| io::Error::other(format!("ListParts {key}: {e}")))?;
            parts.extend(page);
            match next {
                Some(m) if marker.is_none_or(|old| m > old) => marker = Some(m),
                _ => return Ok(parts),
            }
        }
    }

    /// An interrupted upload of `key` to resume (the newest; older ones
    /// are aborted), with the parts it has. One whose parts cannot be
    /// listed is aborted too: the caller starts afresh.
    pub(crate) fn resumable_upload(&self, key: &str) -> io::Result<Option<(String, Parts)>> {
        let mut ups: Vec<(String, String, String)> = self
            .list_uploads(key)?
            .into_iter()
            .filter(|(k, _, _)| k == key)
            .collect();
        if ups.is_empty() {
            return Ok(None);
        }
        ups.sort_by(|a, b| a.2.cmp(&b.2));
        let (_, id, _) = ups.pop().expect("not empty");
        for (k, old, _) in ups {
            self.abort_abandoned(&k, &old);
        }
        match self.list_parts(key, &id) {
            Ok(parts) => Ok(Some((id, parts))),
            Err(e) if Unreachable::is(&e) => Err(e),
            Err(_) => {
                self.abort_abandoned(key, &id);
                Ok(None)
            }
        }
    }

    /// Abort the multipart uploads under the root started more than
    /// `max_age` ago (interrupted runs nobody resumed): `ferry cleanup`.
    /// Returns (key, started) of the uploads aborted (or, with `dry_run`,
    /// that would be).
    pub fn cleanup(&self, max_age: Duration, dry_run: bool) -> io::Result<Vec<(String, String)>> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let mut done = Vec::new();
        for (key, id, initiated) in self.list_uploads(&self.root)? {
            if check_key(&key).is_err() {
                continue; // no request can name it (`abort_upload`)
            }
            let age = parse_http_or_iso_date(&initiated).map_or(i64::MAX, |(t, _)| now - t);
            if age >= max_age.as_secs() as i64 {
                if !dry_run {
                    self.abort_abandoned(&key, &id);
                }
                done.push((key, initiated));
            }
        }
        Ok(done)
    }
}
