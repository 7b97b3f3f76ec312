//! The S3 `Store`: any S3-compatible object storage (AWS S3, Garage,
//! MinIO, Ceph) as a source or destination of copy, sync and ls.
//!
//! Client: rusty-s3 signs requests (Sans-IO, exact keys, every header under
//! our control) and ureq sends them over a pool of keep-alive connections
//! from the engine's worker threads: no async runtime and no hidden
//! executor between the engine's pool and the socket, and the body stream is
//! ours, so `--bwlimit` paces exact bytes. (Design notes: docs/DESIGN.md.)
//!
//! Mapping: a directory is a key prefix ending in `/`, listed with the `/`
//! delimiter, one page of 1,000 keys at a time; a file is an object whose
//! mtime and mode travel in `x-amz-meta-mtime` (seconds with a nanosecond
//! fraction, the format rclone writes and reads) and `x-amz-meta-mode`.
//! Objects without them (uploaded by other tools) use LastModified. An upload
//! is invisible until its single PUT or its multipart completion, so an object
//! is either fully written or absent. S3 has no empty directories, directory
//! metadata, owners or symlinks: the engine asks and skips what cannot be
//! stored.

mod config;

use std::ffi::CStr;
use std::io::{self, Read};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_engine::bwlimit::Limiter;
use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::filter::Filter;
use ferry_engine::store::{ListError, MetaChange, SourceFile, Store};
use rusty_s3::actions::{
    AbortMultipartUpload, CompleteMultipartUpload, CreateMultipartUpload, DeleteObject, GetObject,
    HeadBucket, HeadObject, ListObjectsV2, PutObject, UploadPart,
};
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use ureq::http::Response;
use ureq::Body;

pub use config::{parse_s3_url, S3Config};

/// Objects up to this size go up in one PUT; bigger ones in parts of this size.
pub const PART_SIZE: u64 = 8 << 20;
/// Parts of one object in flight at once.
const PART_CONCURRENCY: usize = 4;
/// How long a signed URL stays valid (one request).
const SIGN_TTL: Duration = Duration::from_secs(3600);
/// Attempts per request on retryable failures (5xx, SlowDown, resets, timeouts).
const ATTEMPTS: u32 = 6;
/// Metadata headers.
const META_MTIME: &str = "x-amz-meta-mtime";
const META_MODE: &str = "x-amz-meta-mode";

/// An S3 bucket and key prefix as a tree.
pub struct S3Store {
    bucket: Bucket,
    creds: Option<Credentials>,
    /// Key prefix of the root: empty or ending in `/`.
    root: String,
    agent: ureq::Agent,
    head_threads: usize,
}

/// A "directory": a key prefix, empty or ending in `/`.
#[derive(Debug, Clone)]
pub struct S3Dir {
    prefix: String,
}

/// An object being read.
pub struct S3Reader {
    body: ureq::BodyReader<'static>,
}

/// An object being written: buffered until it is big enough for a
/// multipart upload, committed by the final PUT or completion.
pub struct S3Writer {
    key: String,
    meta: Meta,
    buf: Vec<u8>,
    upload: Option<Multipart>,
}

struct Multipart {
    id: String,
    etags: Vec<String>,
}

impl S3Store {
    /// Connect to the bucket described by `cfg` (no request is made yet).
    pub fn new(cfg: &S3Config, threads: usize) -> Result<S3Store, String> {
        let style = if cfg.path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(
            cfg.endpoint.clone(),
            style,
            cfg.bucket.clone(),
            cfg.region.clone(),
        )
        .map_err(|e| format!("s3://{}: {e}", cfg.bucket))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(120)))
            .max_idle_connections(256)
            .max_idle_connections_per_host(256)
            .build()
            .into();
        let mut root = cfg.prefix.trim_matches('/').to_string();
        if !root.is_empty() {
            root.push('/');
        }
        Ok(S3Store {
            bucket,
            creds: cfg.credentials.clone(),
            root,
            agent,
            head_threads: threads.clamp(1, 64),
        })
    }

    fn creds(&self) -> Option<&Credentials> {
        self.creds.as_ref()
    }

    /// Send a request, retrying transient failures with exponential backoff
    /// and jitter. `what` and `key` name the request in errors.
    fn send(
        &self,
        what: &str,
        key: &str,
        mut req: impl FnMut() -> Result<Response<Body>, ureq::Error>,
    ) -> io::Result<Response<Body>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let retry = match req() {
                Ok(mut resp) => {
                    let status = resp.status().as_u16();
                    if (200..300).contains(&status) {
                        return Ok(resp);
                    }
                    let body = resp
                        .body_mut()
                        .with_config()
                        .limit(64 << 10)
                        .read_to_string()
                        .unwrap_or_default();
                    let code = xml_field(&body, "Code").unwrap_or_default();
                    let err = status_error(what, key, status, &code, &body);
                    if !(status >= 500
                        || status == 429
                        || code == "SlowDown"
                        || code == "RequestTimeout")
                    {
                        return Err(err);
                    }
                    err
                }
                Err(e) => io::Error::other(format!("{what} {key}: {e}")),
            };
            if attempt >= ATTEMPTS {
                return Err(retry);
            }
            backoff(attempt);
        }
    }

    fn key(&self, dir: &S3Dir, name: &CStr) -> io::Result<String> {
        let name = name.to_str().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "name is not UTF-8 (S3 keys must be)",
            )
        })?;
        Ok(format!("{}{}", dir.prefix, name))
    }

    /// HEAD an object: its metadata as ferry compares it.
    fn head(&self, key: &str, size: u64, last_modified: Option<&str>) -> io::Result<Meta> {
        let url = HeadObject::new(&self.bucket, self.creds(), key).sign(SIGN_TTL);
        let resp = self.send("HEAD", key, || self.agent.head(url.as_str()).call())?;
        let h = resp.headers();
        let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
        let size = get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(size);
        let (mtime_sec, mtime_nsec) = get(META_MTIME)
            .and_then(parse_mtime)
            .or_else(|| last_modified.and_then(parse_http_or_iso_date))
            .or_else(|| get("last-modified").and_then(parse_http_or_iso_date))
            .unwrap_or((0, 0));
        let mode = get(META_MODE)
            .and_then(|m| u32::from_str_radix(m, 8).ok())
            .map_or(0o644, |m| m & 0o7777);
        Ok(Meta {
            kind: Kind::File,
            size,
            mtime_sec,
            mtime_nsec,
            mode,
            uid: 0,
            gid: 0,
            ino: 0,
        })
    }

    fn meta_headers(meta: &Meta) -> [(&'static str, String); 2] {
        [
            (META_MTIME, format_mtime(meta)),
            (META_MODE, format!("{:o}", 0o100000 | meta.mode)),
        ]
    }

    fn put(&self, key: &str, body: &[u8], meta: &Meta) -> io::Result<()> {
        let mut a = PutObject::new(&self.bucket, self.creds(), key);
        let hs = Self::meta_headers(meta);
        for (k, v) in &hs {
            a.headers_mut().insert(*k, v.clone());
        }
        let url = a.sign(SIGN_TTL);
        self.send("PUT", key, || {
            let mut r = self.agent.put(url.as_str());
            for (k, v) in &hs {
                r = r.header(*k, v.as_str());
            }
            r.send(body)
        })?;
        Ok(())
    }

    /// Start the multipart upload of `w` (object metadata goes here).
    fn create_upload(&self, w: &mut S3Writer) -> io::Result<()> {
        if w.upload.is_some() {
            return Ok(());
        }
        let mut a = CreateMultipartUpload::new(&self.bucket, self.creds(), &w.key);
        let hs = Self::meta_headers(&w.meta);
        for (k, v) in &hs {
            a.headers_mut().insert(*k, v.clone());
        }
        let url = a.sign(SIGN_TTL);
        let mut resp = self.send("CreateMultipartUpload", &w.key, || {
            let mut r = self.agent.post(url.as_str());
            for (k, v) in &hs {
                r = r.header(*k, v.as_str());
            }
            r.send_empty()
        })?;
        let body = read_body(&mut resp)?;
        let parsed = CreateMultipartUpload::parse_response(&body)
            .map_err(|e| io::Error::other(format!("CreateMultipartUpload {}: {e}", w.key)))?;
        w.upload = Some(Multipart {
            id: parsed.upload_id().to_string(),
            etags: Vec::new(),
        });
        Ok(())
    }

    /// Send one part; returns its ETag.
    fn put_part(&self, key: &str, id: &str, number: u16, data: &[u8]) -> io::Result<String> {
        let url = UploadPart::new(&self.bucket, self.creds(), key, number, id).sign(SIGN_TTL);
        let resp = self.send("UploadPart", key, || {
            self.agent.put(url.as_str()).send(data)
        })?;
        resp.headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| io::Error::other(format!("UploadPart {key}: no ETag in the answer")))
    }

    /// Upload the rest of `src` as parts, `PART_CONCURRENCY` in flight: the
    /// calling thread reads parts in order while uploader threads send them.
    /// `first` is the first full part, already read.
    fn upload_parts(
        &self,
        w: &mut S3Writer,
        first: Vec<u8>,
        src: &mut dyn SourceFile,
        size: u64,
        chunk: usize,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        self.create_upload(w)?;
        let id = w.upload.as_ref().expect("created").id.clone();
        let key = w.key.clone();
        let etags: std::sync::Mutex<Vec<(u16, String)>> = std::sync::Mutex::new(Vec::new());
        let failed: std::sync::Mutex<Option<io::Error>> = std::sync::Mutex::new(None);
        let mut total = first.len() as u64;
        let (tx, rx) = std::sync::mpsc::sync_channel::<(u16, Vec<u8>)>(1);
        let rx = std::sync::Mutex::new(rx);
        let read_result = std::thread::scope(|scope| -> io::Result<()> {
            // Owned here: dropping it when reading ends lets the uploaders finish.
            let tx = tx;
            for _ in 0..PART_CONCURRENCY {
                scope.spawn(|| loop {
                    let next = rx.lock().expect("part queue").recv();
                    let Ok((n, data)) = next else { return };
                    match self.put_part(&key, &id, n, &data) {
                        Ok(tag) => etags.lock().expect("etags").push((n, tag)),
                        Err(e) => {
                            failed.lock().expect("failed").get_or_insert(e);
                            return;
                        }
                    }
                });
            }
            let mut number = 1u16;
            let mut part = first;
            let mut buf = vec![0u8; chunk];
            loop {
                let full = part.len() >= PART_SIZE as usize;
                if full {
                    let next = part.split_off(PART_SIZE as usize);
                    if tx
                        .send((number, std::mem::replace(&mut part, next)))
                        .is_err()
                    {
                        return Ok(()); // every uploader stopped: `failed` says why
                    }
                    number += 1;
                    continue;
                }
                if failed.lock().expect("failed").is_some() {
                    return Ok(());
                }
                let n = src.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                if let Some(l) = limit {
                    l.acquire(n as u64);
                }
                total += n as u64;
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
        if let Some(e) = failed.into_inner().expect("failed") {
            return Err(e);
        }
        read_result?;
        let mut tags = etags.into_inner().expect("etags");
        tags.sort_by_key(|(n, _)| *n);
        w.upload.as_mut().expect("created").etags = tags.into_iter().map(|(_, t)| t).collect();
        Ok(total)
    }

    fn abort_upload(&self, key: &str, id: &str) {
        let url = AbortMultipartUpload::new(&self.bucket, self.creds(), key, id).sign(SIGN_TTL);
        let _ = self.send("AbortMultipartUpload", key, || {
            self.agent.delete(url.as_str()).call()
        });
    }

    fn delete_key(&self, key: &str) -> io::Result<()> {
        let url = DeleteObject::new(&self.bucket, self.creds(), key).sign(SIGN_TTL);
        self.send("DELETE", key, || self.agent.delete(url.as_str()).call())?;
        Ok(())
    }

    /// One page of a listing under `prefix` (with or without the delimiter).
    fn list_page(
        &self,
        prefix: &str,
        delimiter: bool,
        token: Option<&str>,
    ) -> io::Result<rusty_s3::actions::ListObjectsV2Response> {
        let mut a = ListObjectsV2::new(&self.bucket, self.creds());
        a.with_prefix(prefix);
        if delimiter {
            a.with_delimiter("/");
        }
        if let Some(t) = token {
            a.with_continuation_token(t);
        }
        let url = a.sign(SIGN_TTL);
        let mut resp = self.send("LIST", prefix, || self.agent.get(url.as_str()).call())?;
        let body = read_body(&mut resp)?;
        ListObjectsV2::parse_response(&body)
            .map_err(|e| io::Error::other(format!("LIST {prefix}: {e}")))
    }
}

impl Store for S3Store {
    type Dir = S3Dir;
    type Reader = S3Reader;
    type Writer = S3Writer;

    fn open_root(&self) -> io::Result<Option<(S3Dir, Meta)>> {
        let url = HeadBucket::new(&self.bucket, self.creds()).sign(SIGN_TTL);
        self.send("HEAD bucket", self.bucket.name(), || {
            self.agent.head(url.as_str()).call()
        })?;
        Ok(Some((
            S3Dir {
                prefix: self.root.clone(),
            },
            dir_meta(),
        )))
    }

    fn create_root(&self) -> io::Result<S3Dir> {
        Ok(S3Dir {
            prefix: self.root.clone(),
        })
    }

    fn list(
        &self,
        dir: &S3Dir,
        rel: &[u8],
        filter: Option<&Filter>,
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        out.clear();
        let mut files: Vec<(String, u64, Option<String>)> = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self.list_page(&dir.prefix, true, token.as_deref())?;
            for c in page.contents {
                let name = &c.key[dir.prefix.len().min(c.key.len())..];
                // A "directory marker" object (the prefix itself) is not an entry.
                if name.is_empty() || !c.key.starts_with(&dir.prefix) {
                    continue;
                }
                if filter.is_some_and(|f| f.excluded(rel, name.as_bytes(), false)) {
                    continue;
                }
                files.push((name.to_string(), c.size.unwrap_or(0), c.last_modified));
            }
            for p in page.common_prefixes {
                let name = p.prefix[dir.prefix.len().min(p.prefix.len())..].trim_end_matches('/');
                if name.is_empty() || filter.is_some_and(|f| f.excluded(rel, name.as_bytes(), true))
                {
                    continue;
                }
                out.push(name.as_bytes(), dir_meta());
            }
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        // mtime and mode live in object metadata, which listings do not
        // return: HEAD every object, several at a time.
        let threads = self.head_threads.min(files.len().div_ceil(8)).max(1);
        let chunk = files.len().div_ceil(threads).max(1);
        let results: Vec<Vec<(usize, io::Result<Meta>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = files
                .chunks(chunk)
                .enumerate()
                .map(|(i, part)| {
                    s.spawn(move || {
                        part.iter()
                            .enumerate()
                            .map(|(j, (name, size, lm))| {
                                (
                                    i * chunk + j,
                                    self.head(
                                        &format!("{}{}", dir.prefix, name),
                                        *size,
                                        lm.as_deref(),
                                    ),
                                )
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("HEAD thread panicked"))
                .collect()
        });
        for (i, r) in results.into_iter().flatten() {
            match r {
                Ok(m) => out.push(files[i].0.as_bytes(), m),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(err) => errors.push(ListError {
                    name: files[i].0.as_bytes().to_vec(),
                    err,
                }),
            }
        }
        out.sort();
        Ok(())
    }

    fn stat(&self, dir: &S3Dir, name: &CStr) -> io::Result<Option<Meta>> {
        match self.head(&self.key(dir, name)?, 0, None) {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn open_dir(&self, parent: &S3Dir, name: &CStr) -> io::Result<S3Dir> {
        Ok(S3Dir {
            prefix: format!("{}/", self.key(parent, name)?),
        })
    }

    fn make_dir(&self, parent: &S3Dir, name: &CStr) -> io::Result<S3Dir> {
        self.open_dir(parent, name)
    }

    fn set_dir_meta(&self, _dir: &S3Dir, _meta: &Meta, _what: MetaChange) -> io::Result<()> {
        Ok(())
    }

    fn open_file(&self, dir: &S3Dir, name: &CStr) -> io::Result<S3Reader> {
        let key = self.key(dir, name)?;
        let url = GetObject::new(&self.bucket, self.creds(), &key).sign(SIGN_TTL);
        let resp = self.send("GET", &key, || self.agent.get(url.as_str()).call())?;
        Ok(S3Reader {
            body: resp.into_body().into_reader(),
        })
    }

    fn read_link(&self, dir: &S3Dir, name: &CStr) -> io::Result<Vec<u8>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: S3 has no symlinks", self.key(dir, name)?),
        ))
    }

    fn create_file(&self, dir: &S3Dir, name: &CStr, meta: &Meta) -> io::Result<S3Writer> {
        Ok(S3Writer {
            key: self.key(dir, name)?,
            meta: *meta,
            buf: Vec::new(),
            upload: None,
        })
    }

    fn write_from(
        &self,
        w: &mut S3Writer,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        let part = PART_SIZE as usize;
        w.buf.reserve(part.min(size as usize + 1));
        let chunk_len = limit.map_or(1 << 20, |l| l.chunk());
        let mut chunk = vec![0u8; chunk_len];
        let mut total = 0u64;
        loop {
            let n = src.read(&mut chunk)?;
            if n == 0 {
                return Ok(total);
            }
            if let Some(l) = limit {
                l.acquire(n as u64);
            }
            total += n as u64;
            w.buf.extend_from_slice(&chunk[..n]);
            if total > size {
                return Ok(total);
            }
            if w.buf.len() >= part {
                // Too big for one PUT: parallel multipart from here on.
                let first = std::mem::take(&mut w.buf);
                let rest = self.upload_parts(w, first, src, size, chunk_len, limit)?;
                return Ok(rest);
            }
        }
    }

    fn commit(
        &self,
        _dir: &S3Dir,
        w: S3Writer,
        _name: &CStr,
        _meta: &Meta,
        _fsync: bool,
    ) -> io::Result<()> {
        let mut w = w;
        match w.upload.take() {
            None => self.put(&w.key, &w.buf, &w.meta),
            Some(up) => {
                let complete = CompleteMultipartUpload::new(
                    &self.bucket,
                    self.creds(),
                    &w.key,
                    &up.id,
                    up.etags.iter().map(String::as_str),
                );
                let url = complete.sign(SIGN_TTL);
                let body = complete.body();
                let r = self.send("CompleteMultipartUpload", &w.key, || {
                    self.agent.post(url.as_str()).send(body.as_bytes())
                });
                if r.is_err() {
                    self.abort_upload(&w.key, &up.id);
                }
                r.map(|_| ())
            }
        }
    }

    fn abort(&self, _dir: &S3Dir, w: S3Writer) {
        if let Some(up) = &w.upload {
            self.abort_upload(&w.key, &up.id);
        }
    }

    fn create_symlink(
        &self,
        dir: &S3Dir,
        name: &CStr,
        _target: &[u8],
        _meta: &Meta,
    ) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: S3 has no symlinks", self.key(dir, name)?),
        ))
    }

    fn set_meta(&self, dir: &S3Dir, name: &CStr, meta: &Meta, _what: MetaChange) -> io::Result<()> {
        // Server-side copy onto itself with replaced metadata: no data moves.
        let key = self.key(dir, name)?;
        let source = format!("/{}/{}", self.bucket.name(), encode_key(&key));
        let mut a = PutObject::new(&self.bucket, self.creds(), &key);
        let mut hs: Vec<(&str, String)> = Self::meta_headers(meta).into_iter().collect();
        hs.push(("x-amz-copy-source", source));
        hs.push(("x-amz-metadata-directive", "REPLACE".to_string()));
        for (k, v) in &hs {
            a.headers_mut().insert(*k, v.clone());
        }
        let url = a.sign(SIGN_TTL);
        self.send("COPY", &key, || {
            let mut r = self.agent.put(url.as_str());
            for (k, v) in &hs {
                r = r.header(*k, v.as_str());
            }
            r.send_empty()
        })?;
        Ok(())
    }

    fn remove(&self, dir: &S3Dir, name: &CStr, is_dir: bool) -> io::Result<u64> {
        let key = self.key(dir, name)?;
        if !is_dir {
            self.delete_key(&key)?;
            return Ok(1);
        }
        let prefix = format!("{key}/");
        let mut n = 0;
        let mut token: Option<String> = None;
        loop {
            let page = self.list_page(&prefix, false, token.as_deref())?;
            for c in &page.contents {
                self.delete_key(&c.key)?;
                n += 1;
            }
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        Ok(n + 1)
    }

    fn rename(
        &self,
        from_dir: &S3Dir,
        from_name: &CStr,
        to_dir: &S3Dir,
        to_name: &CStr,
    ) -> io::Result<()> {
        // Server-side copy (data and metadata stay on the server), then
        // delete. S3 has no "copy unless it exists": the check before it is
        // the best an object store offers.
        let from = self.key(from_dir, from_name)?;
        let to = self.key(to_dir, to_name)?;
        match self.head(&to, 0, None) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{to}: exists"),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let source = format!("/{}/{}", self.bucket.name(), encode_key(&from));
        let mut a = PutObject::new(&self.bucket, self.creds(), &to);
        a.headers_mut().insert("x-amz-copy-source", source.clone());
        let url = a.sign(SIGN_TTL);
        self.send("COPY", &to, || {
            self.agent
                .put(url.as_str())
                .header("x-amz-copy-source", source.as_str())
                .send_empty()
        })?;
        self.delete_key(&from)
    }

    fn rmdir(&self, dir: &S3Dir, name: &CStr) -> io::Result<()> {
        // A prefix exists only while it has objects: nothing to remove,
        // but refuse if something is still below it.
        let prefix = format!("{}/", self.key(dir, name)?);
        let page = self.list_page(&prefix, false, None)?;
        if page.contents.is_empty() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("{prefix}: not empty"),
            ))
        }
    }

    fn preserves_owner(&self) -> bool {
        false
    }

    fn has_dir_meta(&self) -> bool {
        false
    }

    fn supports_symlinks(&self) -> bool {
        false
    }
}

impl SourceFile for S3Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.body.read(buf)
    }

    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

fn dir_meta() -> Meta {
    Meta {
        kind: Kind::Dir,
        size: 0,
        mtime_sec: 0,
        mtime_nsec: 0,
        mode: 0o755,
        uid: 0,
        gid: 0,
        ino: 0,
    }
}

fn read_body(resp: &mut Response<Body>) -> io::Result<String> {
    resp.body_mut()
        .with_config()
        .limit(256 << 20)
        .read_to_string()
        .map_err(io::Error::other)
}

fn status_error(what: &str, key: &str, status: u16, code: &str, body: &str) -> io::Error {
    let kind = match status {
        404 => io::ErrorKind::NotFound,
        401 | 403 => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    let msg = xml_field(body, "Message").unwrap_or_default();
    let detail = match (code.is_empty(), msg.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!(" {code}"),
        (false, false) => format!(" {code}: {msg}"),
    };
    io::Error::new(kind, format!("{what} {key}: HTTP {status}{detail}"))
}

/// The text of the first `<name>...</name>` element (S3 error bodies).
fn xml_field(body: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&format!("</{name}>"))? + start;
    Some(body[start..end].to_string())
}

fn backoff(attempt: u32) {
    // 100 ms, 200 ms, 400 ms ... capped at 5 s, plus up to 50% jitter.
    let base = Duration::from_millis(100)
        .saturating_mul(1 << attempt.min(6))
        .min(Duration::from_secs(5));
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = base.mul_f64((nanos % 1000) as f64 / 2000.0);
    let backoff_delay = base + jitter;
    std::thread::sleep(backoff_delay);
}

/// `1600000000.123456789`: seconds with a nanosecond fraction (rclone's format).
pub fn format_mtime(m: &Meta) -> String {
    format!("{}.{:09}", m.mtime_sec, m.mtime_nsec)
}

/// Parse rclone's mtime metadata: seconds, optionally with a fraction.
pub fn parse_mtime(s: &str) -> Option<(i64, u32)> {
    let s = s.trim();
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = sec.parse().ok()?;
    if frac.is_empty() {
        return Some((sec, 0));
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nsec: u32 = digits.parse().ok()?;
    if sec < 0 && nsec > 0 {
        // "-1.5" is 1.5 s before the epoch: -2 s + 0.5 s.
        return Some((sec - 1, 1_000_000_000 - nsec));
    }
    Some((sec, nsec))
}

/// Parse `2024-01-02T03:04:05.000Z` (listings) or an HTTP date
/// (`Tue, 02 Jan 2024 03:04:05 GMT`, Last-Modified) to epoch seconds.
fn parse_http_or_iso_date(s: &str) -> Option<(i64, u32)> {
    let s = s.trim();
    let (y, mo, d, h, mi, se, ns): (i64, i64, i64, i64, i64, i64, u32) =
        if s.len() >= 19 && s.as_bytes()[4] == b'-' {
            let y = s[0..4].parse().ok()?;
            let mo = s[5..7].parse().ok()?;
            let d = s[8..10].parse().ok()?;
            let h = s[11..13].parse().ok()?;
            let mi = s[14..16].parse().ok()?;
            let se = s[17..19].parse().ok()?;
            let ns = s[19..].strip_prefix('.').map_or(0, |f| {
                let digits: String = f
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .take(9)
                    .collect();
                format!("{digits:0<9}").parse().unwrap_or(0)
            });
            (y, mo, d, h, mi, se, ns)
        } else {
            let parts: Vec<&str> = s.split_whitespace().collect();
            if parts.len() < 5 {
                return None;
            }
            let months = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ];
            let mo = months.iter().position(|m| *m == parts[2])? as i64 + 1;
            let t: Vec<&str> = parts[4].split(':').collect();
            if t.len() != 3 {
                return None;
            }
            (
                parts[3].parse().ok()?,
                mo,
                parts[1].parse().ok()?,
                t[0].parse().ok()?,
                t[1].parse().ok()?,
                t[2].parse().ok()?,
                0,
            )
        };
    Some((
        days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se,
        ns,
    ))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// Percent-encode a key for `x-amz-copy-source` (keeping `/`).
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtime_round_trip() {
        let m = Meta {
            kind: Kind::File,
            size: 0,
            mtime_sec: 1_600_000_000,
            mtime_nsec: 123_456_789,
            mode: 0o644,
            uid: 0,
            gid: 0,
            ino: 0,
        };
        assert_eq!(format_mtime(&m), "1600000000.123456789");
        assert_eq!(
            parse_mtime("1600000000.123456789"),
            Some((1_600_000_000, 123_456_789))
        );
        assert_eq!(
            parse_mtime("1600000000.5"),
            Some((1_600_000_000, 500_000_000))
        );
        assert_eq!(parse_mtime("1600000000"), Some((1_600_000_000, 0)));
        assert_eq!(parse_mtime("x"), None);
    }

    #[test]
    fn dates() {
        assert_eq!(
            parse_http_or_iso_date("2024-01-02T03:04:05.250Z"),
            Some((1_704_164_645, 250_000_000))
        );
        assert_eq!(
            parse_http_or_iso_date("Tue, 02 Jan 2024 03:04:05 GMT"),
            Some((1_704_164_645, 0))
        );
        assert_eq!(parse_http_or_iso_date("1970-01-01T00:00:00Z"), Some((0, 0)));
    }

    #[test]
    fn copy_source_encoding() {
        assert_eq!(encode_key("a b/c+d.txt"), "a%20b/c%2Bd.txt");
    }
}
