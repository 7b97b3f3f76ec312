//! The S3 `Store`: any S3-compatible object storage (AWS S3, Garage,
//! MinIO, Ceph) as a source or destination of copy, sync and ls.
//!
//! Client: rusty-s3 signs requests (Sans-IO, exact keys, every header under
//! our control) and ureq sends them over a pool of keep-alive connections
//! from the engine's worker threads: no async runtime and no hidden
//! executor between the engine's pool and the socket, and the body stream is
//! ours, so `--bwlimit` paces exact bytes. Ranged GETs to plain-`http`
//! endpoints skip ureq's buffer copy (`direct`). (Design notes: docs/DESIGN.md.)
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
mod direct;
#[cfg(test)]
mod direct_tests;
mod etag;
mod fail;

use std::any::Any;
use std::collections::HashMap;
use std::ffi::CStr;
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_engine::bwlimit::Limiter;
use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::hash::{Hash, HashKind, HashSet};
use ferry_engine::piece::{with_piece_buffer, DIRECT_ALIGN};
use ferry_engine::store::{ListError, MetaChange, RangedSource, SourceFile, Store, RANGE_PIECE};
use md5::{Digest, Md5};
use rusty_s3::actions::{
    AbortMultipartUpload, CompleteMultipartUpload, CreateMultipartUpload, DeleteObject,
    DeleteObjects, GetObject, HeadBucket, HeadObject, ListObjectsV2, ListParts, ObjectIdentifier,
    PutObject, UploadPart,
};
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use ureq::http::Response;
use ureq::Body;

pub use config::{parse_s3_url, S3Config};
pub use fail::{set_timeout, timeout, Unreachable, DEFAULT_TIMEOUT, UNREACHABLE_AFTER};
use fail::{Health, Reach};

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
/// rclone's whole-object MD5 (base64) of multipart objects, whose ETag is
/// not one: lets `rclone check` verify them.
const META_MD5: &str = "x-amz-meta-md5chksum";

/// What every request needs: the bucket, the credentials and the pool of
/// keep-alive connections. Shared by the store and its readers.
struct Conn {
    bucket: Bucket,
    creds: Option<Credentials>,
    agent: ureq::Agent,
    /// Ranged GETs without ureq, for `http://` endpoints (see `direct`).
    direct: Option<direct::Pool>,
    counters: Counters,
    /// The endpoint as the user gave it (for messages).
    endpoint: String,
    /// `s3://bucket/prefix` of the store's root (for messages).
    root_url: String,
    /// No-progress timeout of a request (`--timeout`).
    timeout: Duration,
    /// Whether the endpoint answers (the unreachable rule).
    health: Health,
}

/// An S3 bucket and key prefix as a tree.
pub struct S3Store {
    c: Arc<Conn>,
    /// Key prefix of the root: empty or ending in `/`.
    root: String,
    head_threads: usize,
    /// List without a HEAD per object (see `Store::approximate_meta`).
    lazy_meta: bool,
    /// The server refused a DeleteObjects: delete one key per request.
    no_batch_delete: AtomicBool,
}

/// What the store did beyond plain requests (for `-v` and the tests).
#[derive(Debug, Default)]
pub struct Counters {
    /// Multipart parts uploaded.
    pub parts_sent: AtomicU64,
    /// Parts of an interrupted upload found on the server and kept.
    pub parts_reused: AtomicU64,
    /// Multipart uploads resumed.
    pub uploads_resumed: AtomicU64,
    /// Abandoned multipart uploads aborted.
    pub uploads_aborted: AtomicU64,
    /// Objects copied server-side (S3 to S3 on the same server).
    pub server_copies: AtomicU64,
    /// HEAD requests (object metadata).
    pub heads: AtomicU64,
    /// Ranged GETs answered on the direct path (plain HTTP, no ureq).
    pub direct_gets: AtomicU64,
    /// Ranged GETs sent again through ureq after an answer the direct
    /// path does not handle.
    pub direct_fallbacks: AtomicU64,
    /// Key ranges of wide directory prefixes listed in parallel.
    pub list_ranges: AtomicU64,
    /// DeleteObjects requests (up to 1,000 keys each).
    pub batch_deletes: AtomicU64,
}

/// A "directory": a key prefix, empty or ending in `/`.
#[derive(Debug, Clone)]
pub struct S3Dir {
    prefix: String,
}

/// An object being read. Nothing is requested until the first `read`: a
/// writer may instead fetch it as parallel ranges (`RangedSource`) or copy
/// it server-side.
pub struct S3Reader {
    c: Arc<Conn>,
    key: String,
    body: Option<ureq::BodyReader<'static>>,
    /// Size and ETag, once asked.
    ident: OnceLock<(u64, String)>,
    /// Exact metadata, from the GET's or the HEAD's headers.
    meta: OnceLock<Meta>,
    /// Its `X-Amz-Meta-Md5chksum`, from the HEAD's headers.
    md5: OnceLock<String>,
}

/// An object being written: buffered until it is big enough for a
/// multipart upload, committed by the final PUT or completion.
pub struct S3Writer {
    key: String,
    meta: Meta,
    buf: Vec<u8>,
    upload: Option<Multipart>,
    /// Server-side copy from this `/bucket/key` (encoded) at commit.
    copy_from: Option<(String, u64, Option<String>)>,
}

struct Multipart {
    id: String,
    etags: Vec<String>,
    /// Base64 of the whole object's MD5, once every byte was read.
    md5: Option<String>,
    /// An interrupted upload taken over: its metadata may be stale.
    resumed: bool,
}

/// An object to HEAD: name in its directory, listed size, fallback mtime.
type HeadArg<'a> = (&'a str, u64, Option<(i64, u32)>);

/// Parts of a multipart upload on the server: number → (size, ETag).
type Parts = HashMap<u16, (u64, String)>;

/// Largest object a single CopyObject may copy.
const COPY_MAX: u64 = 5 << 30;
/// Part size of server-side multipart copies.
const COPY_PART: u64 = 512 << 20;

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
        // No deadline on a whole request (a big part on a slow link takes
        // what it takes), but none waits more than `timeout` for a byte.
        let timeout = fail::timeout();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(fail::CONNECT_TIMEOUT))
            .timeout_per_read(Some(timeout))
            .timeout_per_write(Some(timeout))
            .max_idle_connections(256)
            .max_idle_connections_per_host(256)
            .build()
            .into();
        let direct = direct::Pool::for_url(bucket.base_url(), timeout);
        let mut root = cfg.prefix.trim_matches('/').to_string();
        if !root.is_empty() {
            root.push('/');
        }
        Ok(S3Store {
            c: Arc::new(Conn {
                bucket,
                creds: cfg.credentials.clone(),
                agent,
                direct,
                counters: Counters::default(),
                endpoint: cfg.endpoint.as_str().trim_end_matches('/').to_string(),
                root_url: format!("s3://{}/{}", cfg.bucket, root)
                    .trim_end_matches('/')
                    .to_string(),
                timeout,
                health: Health::default(),
            }),
            root,
            head_threads: threads.clamp(1, 64),
            lazy_meta: false,
            no_batch_delete: AtomicBool::new(false),
        })
    }

    /// Listings without a HEAD per object: exact sizes, approximate mtimes
    /// and modes until the engine asks for exact ones (`Store::refine`) of
    /// the objects it compares. For copy and sync, and `ls --server-mtime`.
    pub fn with_lazy_meta(mut self) -> S3Store {
        self.lazy_meta = true;
        self
    }

    /// What the store did (parts sent and reused, uploads resumed, ...).
    pub fn counters(&self) -> &Counters {
        &self.c.counters
    }
}

impl Conn {
    fn creds(&self) -> Option<&Credentials> {
        self.creds.as_ref()
    }

    /// True when `other` is the same server and account (server-side copy
    /// between them works).
    fn same_server(&self, other: &Conn) -> bool {
        let (a, b) = (self.bucket.base_url(), other.bucket.base_url());
        a.host_str() == b.host_str()
            && a.port_or_known_default() == b.port_or_known_default()
            && self.creds.as_ref().map(Credentials::key)
                == other.creds.as_ref().map(Credentials::key)
    }

    /// `s3://bucket/key` (`s3://bucket` for the bucket itself).
    fn url_of(&self, key: &str) -> String {
        if key.is_empty() {
            format!("s3://{}", self.bucket.name())
        } else {
            format!("s3://{}/{key}", self.bucket.name())
        }
    }

    /// The cause in a message about the endpoint, without the endpoint:
    /// `connection refused`, `no answer for 30 s`.
    fn short_cause(&self, msg: &str) -> String {
        msg.rsplit(": ")
            .next()
            .unwrap_or(msg)
            .replace(&format!(" from {}", self.endpoint), "")
    }

    /// The error of every request once the endpoint is unreachable.
    fn unreachable(&self, why: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotConnected,
            Unreachable(format!(
                "{}: endpoint {} unreachable: {why}",
                self.root_url, self.endpoint
            )),
        )
    }

    /// An error status as a message: the path, what the status means, the
    /// status and the server's words, the endpoint.
    fn status_error(
        &self,
        what: &str,
        key: &str,
        status: u16,
        code: &str,
        body: &str,
    ) -> io::Error {
        let on_bucket = key.is_empty() || what == "LIST" || what == "ListMultipartUploads";
        let (kind, detail) = status_detail(status, code, body);
        let meaning = fail::meaning(status, code, on_bucket);
        let (url, ep) = (self.url_of(key), &self.endpoint);
        let text = if meaning.is_empty() {
            format!("{what} {url}: {detail} (endpoint {ep})")
        } else {
            format!("{what} {url}: {meaning} ({detail}; endpoint {ep})")
        };
        io::Error::new(kind, text)
    }

    /// An attempt that could not reach the server (or reach it in time):
    /// noted in the endpoint's health; a stall is announced once.
    fn note_io(&self, what: &str, key: &str, e: &ureq::Error) -> (Reach, io::Error) {
        let (reach, msg) = fail::classify(e, &self.endpoint, self.timeout);
        self.note(reach, matches!(e, ureq::Error::Timeout(t) if *t != ureq::Timeout::Connect)
            || matches!(e, ureq::Error::Io(i) if matches!(i.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock)));
        (
            reach,
            io::Error::other(format!("{what} {}: {msg}", self.url_of(key))),
        )
    }

    fn note(&self, reach: Reach, stalled: bool) {
        self.health.note(reach);
        if stalled && self.health.first_stall() {
            eprintln!(
                "ferry: s3 {}: no answer for {} (retrying)",
                self.endpoint,
                fail::secs(self.timeout)
            );
        }
    }

    /// Send a request, retrying transient failures with exponential backoff
    /// and jitter. `what` and `key` name the request in errors. Once the
    /// endpoint is unreachable (see [`fail::Health`]) every request fails
    /// at once with an [`Unreachable`] error.
    fn send(
        &self,
        what: &str,
        key: &str,
        mut req: impl FnMut() -> Result<Response<Body>, ureq::Error>,
    ) -> io::Result<Response<Body>> {
        let mut attempt = 0;
        loop {
            if let Some(why) = self.health.gone() {
                return Err(self.unreachable(why));
            }
            attempt += 1;
            let (retry, reach) = match req() {
                Ok(mut resp) => {
                    self.health.note(Reach::Answered);
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
                    let err = self.status_error(what, key, status, &code, &body);
                    // 501 Not Implemented is not a passing state.
                    if !(status >= 500 && status != 501
                        || status == 429
                        || code == "SlowDown"
                        || code == "RequestTimeout")
                    {
                        return Err(err);
                    }
                    (err, Reach::Answered)
                }
                Err(e) => {
                    let (reach, err) = self.note_io(what, key, &e);
                    (err, reach)
                }
            };
            if attempt >= ATTEMPTS {
                if reach == Reach::Failed {
                    let why = self.short_cause(&retry.to_string());
                    if self.health.gave_up(&why) {
                        return Err(self.unreachable(self.health.gone().unwrap_or(&why)));
                    }
                }
                return Err(retry);
            }
            backoff(attempt);
        }
    }
}

impl S3Store {
    fn key(&self, dir: &S3Dir, name: &CStr) -> io::Result<String> {
        let name = name.to_str().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "name is not UTF-8 (S3 keys must be)",
            )
        })?;
        let key = format!("{}{}", dir.prefix, name);
        check_key(&key)?;
        Ok(key)
    }

    /// HEAD an object: its metadata as ferry compares it.
    /// HEAD an object. `fallback`: the mtime to use when the object has no
    /// `x-amz-meta-mtime` (the listing's LastModified, which has
    /// milliseconds; the Last-Modified header has only seconds).
    fn head(&self, key: &str, size: u64, fallback: Option<(i64, u32)>) -> io::Result<Meta> {
        Ok(self.head_md5(key, size, fallback)?.0)
    }

    /// [`head`](Self::head), and the object's `X-Amz-Meta-Md5chksum`.
    fn head_md5(
        &self,
        key: &str,
        size: u64,
        fallback: Option<(i64, u32)>,
    ) -> io::Result<(Meta, Option<String>)> {
        self.c.counters.heads.fetch_add(1, Ordering::Relaxed);
        let url = HeadObject::new(&self.c.bucket, self.c.creds(), key).sign(SIGN_TTL);
        let resp = self
            .c
            .send("HEAD", key, || self.c.agent.head(url.as_str()).call())?;
        Ok((
            meta_from_headers(resp.headers(), size, fallback),
            md5_from_headers(resp.headers()),
        ))
    }

    /// The ETag (quotes removed, lower case) and `X-Amz-Meta-Md5chksum` of
    /// object `name` in `dir` (`--checksum`).
    fn etag_md5(&self, dir: &S3Dir, name: &CStr) -> io::Result<(Option<String>, Option<String>)> {
        let key = self.key(dir, name)?;
        let url = HeadObject::new(&self.c.bucket, self.c.creds(), &key).sign(SIGN_TTL);
        let resp = self
            .c
            .send("HEAD", &key, || self.c.agent.head(url.as_str()).call())?;
        let h = resp.headers();
        let tag = h.get("etag").and_then(|v| v.to_str().ok());
        Ok((
            tag.map(|e| e.trim_matches('"').to_ascii_lowercase()),
            md5_from_headers(h),
        ))
    }

    /// HEAD several objects of `prefix` at once: (name, listed size,
    /// LastModified) → metadata, in the same order.
    fn head_many(&self, prefix: &str, files: &[HeadArg<'_>]) -> Vec<io::Result<Meta>> {
        self.in_parallel(files, 8, |(name, size, lm)| {
            self.head(&format!("{prefix}{name}"), *size, *lm)
        })
    }

    /// `f` of every item, on up to `head_threads` threads (at least
    /// `per_thread` items each), in the items' order: for requests that
    /// each wait on a round trip.
    fn in_parallel<T: Sync, R: Send>(
        &self,
        items: &[T],
        per_thread: usize,
        f: impl Fn(&T) -> R + Sync,
    ) -> Vec<R> {
        let threads = self
            .head_threads
            .min(items.len().div_ceil(per_thread))
            .max(1);
        let chunk = items.len().div_ceil(threads).max(1);
        let f = &f;
        std::thread::scope(|s| {
            let handles: Vec<_> = items
                .chunks(chunk)
                .map(|part| s.spawn(move || part.iter().map(f).collect::<Vec<_>>()))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("request thread panicked"))
                .collect()
        })
    }

    /// Delete `keys` (at most 1,000, one listing page): one DeleteObjects
    /// request instead of a DELETE per key. A server that refuses it (GCS's
    /// S3 API has none) gets one DELETE per key, several at a time.
    fn delete_keys(&self, keys: &[String]) -> io::Result<()> {
        if keys.len() > 1 && !self.no_batch_delete.load(Ordering::Relaxed) {
            match self.delete_batch(keys) {
                Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                    self.no_batch_delete.store(true, Ordering::Relaxed);
                }
                r => return r,
            }
        }
        self.in_parallel(keys, 8, |k| match self.delete_key(k) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .into_iter()
        .collect()
    }

    /// One DeleteObjects (quiet: the answer lists only the keys that
    /// failed). `Unsupported` when the server does not offer it.
    fn delete_batch(&self, keys: &[String]) -> io::Result<()> {
        let ids: Vec<ObjectIdentifier> = keys
            .iter()
            .map(|k| ObjectIdentifier::new(k.clone()))
            .collect();
        let mut action = DeleteObjects::new(&self.c.bucket, self.c.creds(), ids.iter());
        action.set_quiet(true);
        let url = action.sign(SIGN_TTL);
        let (body, md5) = action.body_with_md5();
        self.c
            .counters
            .batch_deletes
            .fetch_add(1, Ordering::Relaxed);
        let what = format!("{} (and {} more)", keys[0], keys.len() - 1);
        let mut resp = self.c.send("DeleteObjects", &what, || {
            self.c
                .agent
                .post(url.as_str())
                .header("content-md5", &md5)
                .send(body.as_bytes())
        })?;
        let answer = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| io::Error::other(format!("DeleteObjects {what}: {e}")))?;
        match xml_blocks(&answer, "Error").first() {
            None => Ok(()),
            Some(e) => Err(io::Error::other(format!(
                "DELETE {}: {} {}",
                xml_field(e, "Key").unwrap_or_default(),
                xml_field(e, "Code").unwrap_or_default(),
                xml_field(e, "Message").unwrap_or_default()
            ))),
        }
    }

    fn meta_headers(meta: &Meta) -> [(&'static str, String); 2] {
        [
            (META_MTIME, format_mtime(meta)),
            (META_MODE, format!("{:o}", 0o100000 | meta.mode)),
        ]
    }

    fn put(&self, key: &str, body: &[u8], meta: &Meta) -> io::Result<()> {
        let mut a = PutObject::new(&self.c.bucket, self.c.creds(), key);
        let hs = Self::meta_headers(meta);
        for (k, v) in &hs {
            a.headers_mut().insert(*k, v.clone());
        }
        let url = a.sign(SIGN_TTL);
        self.c.send("PUT", key, || {
            let mut r = self.c.agent.put(url.as_str());
            for (k, v) in &hs {
                r = r.header(*k, v.as_str());
            }
            r.send(body)
        })?;
        Ok(())
    }

    /// Start the multipart upload of `w` (object metadata goes here).
    /// `md5`: the object's `X-Amz-Meta-Md5chksum`, when known up front.
    fn create_upload(&self, w: &mut S3Writer, md5: Option<&str>) -> io::Result<()> {
        if w.upload.is_some() {
            return Ok(());
        }
        let mut a = CreateMultipartUpload::new(&self.c.bucket, self.c.creds(), &w.key);
        let mut hs: Vec<(&str, String)> = Self::meta_headers(&w.meta).into_iter().collect();
        if let Some(m) = md5 {
            hs.push((META_MD5, m.to_string()));
        }
        for (k, v) in &hs {
            a.headers_mut().insert(*k, v.clone());
        }
        let url = a.sign(SIGN_TTL);
        let mut resp = self.c.send("CreateMultipartUpload", &w.key, || {
            let mut r = self.c.agent.post(url.as_str());
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
            md5: None,
            resumed: false,
        });
        Ok(())
    }

    /// Send one part; returns its ETag.
    fn put_part(&self, key: &str, id: &str, number: u16, data: &[u8]) -> io::Result<String> {
        self.c.counters.parts_sent.fetch_add(1, Ordering::Relaxed);
        let url = UploadPart::new(&self.c.bucket, self.c.creds(), key, number, id).sign(SIGN_TTL);
        let resp = self.c.send("UploadPart", key, || {
            self.c.agent.put(url.as_str()).send(data)
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
        // An earlier run's upload of this key is taken over: each of its
        // parts whose size and MD5 match what we read is kept, not re-sent.
        // An upload that cannot be resumed, for whatever reason, is not a
        // reason to fail the file: it is started afresh.
        let prior = match self.resumable_upload(&w.key) {
            Ok(p) => p,
            Err(e) if Unreachable::is(&e) => return Err(e),
            Err(_) => None,
        };
        let prior_parts = match prior {
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
        };
        let id = w.upload.as_ref().expect("created").id.clone();
        let key = w.key.clone();
        let etags: std::sync::Mutex<Vec<(u16, String)>> = std::sync::Mutex::new(Vec::new());
        let failed: std::sync::Mutex<Option<io::Error>> = std::sync::Mutex::new(None);
        let has_failed = || failed.lock().expect("failed").is_some();
        // The whole file's MD5, from the bytes as they are read (rclone's
        // `X-Amz-Meta-Md5chksum`, set at commit).
        let mut whole = Md5::new();
        whole.update(&first);
        let mut total = first.len() as u64;
        let (tx, rx) = std::sync::mpsc::sync_channel::<(u16, Vec<u8>)>(1);
        let rx = std::sync::Mutex::new(rx);
        let read_result = std::thread::scope(|scope| -> io::Result<()> {
            // Owned here: dropping it when reading ends lets the uploaders finish.
            let tx = tx;
            for _ in 0..PART_CONCURRENCY {
                // After a failure every uploader keeps taking parts off the
                // queue (and drops them) until the reader stops: a reader
                // never waits on a queue nobody takes from.
                scope.spawn(|| loop {
                    let next = rx.lock().expect("part queue").recv();
                    let Ok((n, data)) = next else { return };
                    if has_failed() {
                        continue;
                    }
                    if let Some((size, tag)) = prior_parts.get(&n) {
                        if *size == data.len() as u64
                            && tag
                                .trim_matches('"')
                                .eq_ignore_ascii_case(&etag::md5_hex(&data))
                        {
                            self.c.counters.parts_reused.fetch_add(1, Ordering::Relaxed);
                            etags.lock().expect("etags").push((n, tag.clone()));
                            continue;
                        }
                    }
                    match self.put_part(&key, &id, n, &data) {
                        Ok(tag) => etags.lock().expect("etags").push((n, tag)),
                        Err(e) => {
                            failed.lock().expect("failed").get_or_insert(e);
                        }
                    }
                });
            }
            let mut number = 1u16;
            let mut part = first;
            let mut buf = vec![0u8; chunk];
            loop {
                if has_failed() {
                    return Ok(()); // `failed` says why
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
        if let Some(e) = failed.into_inner().expect("failed") {
            return Err(e);
        }
        read_result?;
        let mut tags = etags.into_inner().expect("etags");
        tags.sort_by_key(|(n, _)| *n);
        let up = w.upload.as_mut().expect("created");
        up.etags = tags.into_iter().map(|(_, t)| t).collect();
        up.md5 = (total == size).then(|| base64(&whole.finalize()));
        Ok(total)
    }

    fn abort_upload(&self, key: &str, id: &str) {
        if check_key(key).is_err() {
            return;
        }
        let url = AbortMultipartUpload::new(&self.c.bucket, self.c.creds(), key, id).sign(SIGN_TTL);
        let _ = self.c.send("AbortMultipartUpload", key, || {
            self.c.agent.delete(url.as_str()).call()
        });
    }

    fn delete_key(&self, key: &str) -> io::Result<()> {
        let url = DeleteObject::new(&self.c.bucket, self.c.creds(), key).sign(SIGN_TTL);
        self.c
            .send("DELETE", key, || self.c.agent.delete(url.as_str()).call())?;
        Ok(())
    }

    /// `x-amz-copy-source` of a key of this bucket.
    fn source_of(&self, key: &str) -> String {
        format!("/{}/{}", self.c.bucket.name(), encode_key(key))
    }

    /// Server-side copy of `source` (`/bucket/key`, `size` bytes) to `key`
    /// with `meta` as its metadata: one CopyObject up to 5 GiB, a multipart
    /// copy (UploadPartCopy, parts in parallel) above.
    fn copy_object(
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
        let mut a = PutObject::new(&self.c.bucket, self.c.creds(), key);
        let mut hs: Vec<(&str, String)> = Self::meta_headers(meta).into_iter().collect();
        if let Some(m) = md5 {
            hs.push((META_MD5, m.to_string()));
        }
        hs.push(("x-amz-copy-source", source.to_string()));
        hs.push(("x-amz-metadata-directive", "REPLACE".to_string()));
        for (k, v) in &hs {
            a.headers_mut().insert(*k, v.clone());
        }
        let url = a.sign(SIGN_TTL);
        let mut resp = self.c.send("COPY", key, || {
            let mut r = self.c.agent.put(url.as_str());
            for (k, v) in &hs {
                r = r.header(*k, v.as_str());
            }
            r.send_empty()
        })?;
        // A copy can fail after the 200 status line: the error is in the body.
        let body = read_body(&mut resp)?;
        if body.contains("<Error>") {
            let code = xml_field(&body, "Code").unwrap_or_default();
            return Err(self.c.status_error("COPY", key, 200, &code, &body));
        }
        Ok(())
    }

    fn copy_multipart(
        &self,
        key: &str,
        source: &str,
        size: u64,
        meta: &Meta,
        md5: Option<&str>,
    ) -> io::Result<()> {
        let mut w = S3Writer {
            key: key.to_string(),
            meta: *meta,
            buf: Vec::new(),
            upload: None,
            copy_from: None,
        };
        self.create_upload(&mut w, md5)?;
        let id = w.upload.as_ref().expect("created").id.clone();
        let parts = size.div_ceil(COPY_PART);
        let next = AtomicU64::new(0);
        let etags: std::sync::Mutex<Vec<(u16, String)>> = std::sync::Mutex::new(Vec::new());
        let failed: std::sync::Mutex<Option<io::Error>> = std::sync::Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..PART_CONCURRENCY.min(parts as usize) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= parts || failed.lock().expect("failed").is_some() {
                        return;
                    }
                    let (a, b) = (i * COPY_PART, ((i + 1) * COPY_PART).min(size) - 1);
                    let n = (i + 1) as u16;
                    let mut act = UploadPart::new(&self.c.bucket, self.c.creds(), key, n, &id);
                    let range = format!("bytes={a}-{b}");
                    act.headers_mut()
                        .insert("x-amz-copy-source", source.to_string());
                    act.headers_mut()
                        .insert("x-amz-copy-source-range", range.clone());
                    let url = act.sign(SIGN_TTL);
                    let r = self
                        .c
                        .send("UploadPartCopy", key, || {
                            self.c
                                .agent
                                .put(url.as_str())
                                .header("x-amz-copy-source", source)
                                .header("x-amz-copy-source-range", range.as_str())
                                .send_empty()
                        })
                        .and_then(|mut resp| read_body(&mut resp))
                        .and_then(|body| {
                            xml_field(&body, "ETag").ok_or_else(|| {
                                io::Error::other(format!("UploadPartCopy {key}: no ETag"))
                            })
                        });
                    match r {
                        Ok(tag) => etags
                            .lock()
                            .expect("etags")
                            .push((n, tag.replace("&quot;", "\""))),
                        Err(e) => {
                            failed.lock().expect("failed").get_or_insert(e);
                            return;
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().expect("failed") {
            self.abort_upload(key, &id);
            return Err(e);
        }
        let mut tags = etags.into_inner().expect("etags");
        tags.sort_by_key(|(n, _)| *n);
        let tags: Vec<String> = tags.into_iter().map(|(_, t)| t).collect();
        self.complete(key, &id, &tags)
    }

    fn complete(&self, key: &str, id: &str, etags: &[String]) -> io::Result<()> {
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
            self.c.agent.post(url.as_str()).send(body.as_bytes())
        });
        if r.is_err() {
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
            for block in xml_blocks(&body, "Upload") {
                let get = |n| xml_field(block, n).map(|v| xml_unescape(&v));
                if let (Some(k), Some(u)) = (get("Key"), get("UploadId")) {
                    out.push((k, u, get("Initiated").unwrap_or_default()));
                }
            }
            let truncated = xml_field(&body, "IsTruncated").is_some_and(|t| t == "true");
            match (
                truncated,
                xml_field(&body, "NextKeyMarker"),
                xml_field(&body, "NextUploadIdMarker"),
            ) {
                (true, Some(k), Some(u)) => markers = Some((xml_unescape(&k), u)),
                _ => return Ok(out),
            }
        }
    }

    /// Sign a GET on the bucket itself with `query` (for requests rusty-s3
    /// has no action for).
    fn sign_bucket_get(&self, query: &[(&str, &str)]) -> url::Url {
        let url = self.c.bucket.base_url().clone();
        // Signing wants the query sorted by name.
        let mut query = query.to_vec();
        query.sort();
        let Some(creds) = self.c.creds() else {
            let mut url = url;
            url.query_pairs_mut().extend_pairs(query.iter().copied());
            return url;
        };
        rusty_s3::signing::sign(
            &jiff::Timestamp::now(),
            rusty_s3::Method::Get,
            url,
            creds.key(),
            creds.secret(),
            creds.token(),
            self.c.bucket.region(),
            SIGN_TTL.as_secs(),
            query.iter().copied(),
            std::iter::empty(),
        )
    }

    /// The parts of upload `id` on the server: number → (size, ETag).
    /// Read leniently: the `<Part>` elements of whatever root element the
    /// server answers with (moto's is `ListPartsResponse`).
    fn list_parts(&self, key: &str, id: &str) -> io::Result<Parts> {
        let mut parts = HashMap::new();
        let mut marker: Option<u16> = None;
        loop {
            let mut a = ListParts::new(&self.c.bucket, self.c.creds(), key, id);
            if let Some(m) = marker {
                a.set_part_number_marker(m);
            }
            let url = a.sign(SIGN_TTL);
            let mut resp = self
                .c
                .send("ListParts", key, || self.c.agent.get(url.as_str()).call())?;
            let body = read_body(&mut resp)?;
            let (page, next) = parse_parts(&body)
                .ok_or_else(|| io::Error::other(format!("ListParts {key}: unreadable answer")))?;
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
    fn resumable_upload(&self, key: &str) -> io::Result<Option<(String, Parts)>> {
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
            self.abort_upload(&k, &old);
            self.c
                .counters
                .uploads_aborted
                .fetch_add(1, Ordering::Relaxed);
        }
        match self.list_parts(key, &id) {
            Ok(parts) => Ok(Some((id, parts))),
            Err(e) if Unreachable::is(&e) => Err(e),
            Err(_) => {
                self.abort_upload(key, &id);
                self.c
                    .counters
                    .uploads_aborted
                    .fetch_add(1, Ordering::Relaxed);
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
                    self.abort_upload(&key, &id);
                    self.c
                        .counters
                        .uploads_aborted
                        .fetch_add(1, Ordering::Relaxed);
                }
                done.push((key, initiated));
            }
        }
        Ok(done)
    }

    /// One page of a listing under `prefix` (with or without the delimiter).
    fn list_page(
        &self,
        prefix: &str,
        delimiter: bool,
        token: Option<&str>,
    ) -> io::Result<rusty_s3::actions::ListObjectsV2Response> {
        self.list_page_after(prefix, delimiter, token, None)
    }

    /// Every page of the listing of one directory prefix (with the `/`
    /// delimiter). A prefix wider than one page is not paged through one
    /// request after another: once the first page shows how its names are
    /// made, the rest of the key space is cut into ranges at guessed
    /// boundaries ([`split_points`]) listed in parallel, each from its
    /// lower bound (StartAfter) to its upper bound. The ranges partition
    /// the keys exactly whatever the guesses; good guesses only make them
    /// even.
    fn list_dir_pages(&self, prefix: &str) -> io::Result<Vec<ListPage>> {
        let first = self.list_page(prefix, true, None)?;
        let Some(token) = first.next_continuation_token.clone() else {
            return Ok(vec![first.into()]);
        };
        let names: Vec<&str> = first
            .contents
            .iter()
            .map(|c| c.key.as_str())
            .chain(first.common_prefixes.iter().map(|p| p.prefix.as_str()))
            .map(|k| k.get(prefix.len()..).unwrap_or(""))
            .collect();
        let bounds = split_points(&names, 15);
        if bounds.is_empty() {
            // No guess: page through in order.
            let mut pages = vec![ListPage::from(first)];
            pages.extend(self.list_range(prefix, Some(&token), None, None)?);
            return Ok(pages);
        }
        // Range 0 continues the first page up to the first bound; range i
        // covers (bounds[i-1], bounds[i]]; the last one is open. As
        // (continuation token, start after, up to), on up to 16 threads.
        let full: Vec<String> = bounds.iter().map(|b| format!("{prefix}{b}")).collect();
        let ranges: Vec<(Option<&str>, Option<&str>, Option<&str>)> = (0..=full.len())
            .map(|i| match i.checked_sub(1) {
                None => (Some(token.as_str()), None, full.first().map(String::as_str)),
                Some(j) => (
                    None,
                    Some(full[j].as_str()),
                    full.get(i).map(String::as_str),
                ),
            })
            .collect();
        self.counters()
            .list_ranges
            .fetch_add(ranges.len() as u64, Ordering::Relaxed);
        let mut pages = vec![ListPage::from(first)];
        for r in self.in_parallel(&ranges, ranges.len().div_ceil(16), |&(t, after, upto)| {
            self.list_range(prefix, t, after, upto)
        }) {
            pages.extend(r?);
        }
        Ok(pages)
    }

    /// The pages of a listing from `token` or from after key `after`, up
    /// to and including key `upto` (entries past it dropped).
    fn list_range(
        &self,
        prefix: &str,
        token: Option<&str>,
        after: Option<&str>,
        upto: Option<&str>,
    ) -> io::Result<Vec<ListPage>> {
        let mut pages = Vec::new();
        let mut token = token.map(str::to_string);
        let mut first = true;
        loop {
            let p = self.list_page_after(
                prefix,
                true,
                token.as_deref(),
                if first { after } else { None },
            )?;
            first = false;
            let mut page = ListPage::from(p);
            let mut past = false;
            if let Some(u) = upto {
                past = page.contents.last().is_some_and(|c| c.key.as_str() > u)
                    || page
                        .common_prefixes
                        .last()
                        .is_some_and(|c| c.prefix.as_str() > u);
                page.contents.retain(|c| c.key.as_str() <= u);
                page.common_prefixes.retain(|c| c.prefix.as_str() <= u);
            }
            token = page.next.take();
            pages.push(page);
            if past || token.is_none() {
                return Ok(pages);
            }
        }
    }

    /// One page of a listing; `start_after`: only keys after this one.
    fn list_page_after(
        &self,
        prefix: &str,
        delimiter: bool,
        token: Option<&str>,
        start_after: Option<&str>,
    ) -> io::Result<rusty_s3::actions::ListObjectsV2Response> {
        let mut a = ListObjectsV2::new(&self.c.bucket, self.c.creds());
        a.with_prefix(prefix);
        if delimiter {
            a.with_delimiter("/");
        }
        if let Some(t) = token {
            a.with_continuation_token(t);
        } else if let Some(s) = start_after {
            a.with_start_after(s);
        }
        let url = a.sign(SIGN_TTL);
        let mut resp = self
            .c
            .send("LIST", prefix, || self.c.agent.get(url.as_str()).call())?;
        let body = read_body(&mut resp)?;
        ListObjectsV2::parse_response(&body)
            .map_err(|e| io::Error::other(format!("LIST {prefix}: {e}")))
    }
}

impl S3Store {
    /// The error of a listed key that no file path can hold: `name` (in
    /// the directory listed) is `.` or `..`, or a prefix of such a segment
    /// or of an empty one (`/`, `./`, `../`).
    fn unnamable(&self, name: &str, key: &str) -> ListError {
        let what = match name.trim_end_matches('/') {
            "" => "an empty segment",
            "." => "a \".\" segment",
            _ => "a \"..\" segment",
        };
        let b = self.c.bucket.name();
        let msg = if name.ends_with('/') {
            format!(
                "the keys under s3://{b}/{key} have {what}, which no file path can hold: skipped"
            )
        } else {
            format!("the key s3://{b}/{key} has {what}, which no file path can hold: skipped")
        };
        ListError {
            name: name.as_bytes().to_vec(),
            err: io::Error::new(io::ErrorKind::InvalidData, msg),
        }
    }

    /// The object at the root itself (`s3://bucket/KEY` naming one object
    /// rather than a prefix): its metadata, `None` when there is none.
    pub fn root_object(&self) -> io::Result<Option<Meta>> {
        let key = self.root.trim_end_matches('/');
        if key.is_empty() {
            return Ok(None);
        }
        check_key(key)?;
        match self.head(key, 0, None) {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// True when at least one object's key starts with the root prefix
    /// (`KEY/`; any key in the bucket for the bucket's root). A missing
    /// bucket is an error (`NotFound`).
    pub fn root_has_objects(&self) -> io::Result<bool> {
        let mut a = ListObjectsV2::new(&self.c.bucket, self.c.creds());
        a.with_prefix(self.root.as_str());
        a.with_max_keys(1);
        let url = a.sign(SIGN_TTL);
        let mut resp = self
            .c
            .send("LIST", &self.root, || self.c.agent.get(url.as_str()).call())?;
        let body = read_body(&mut resp)?;
        let page = ListObjectsV2::parse_response(&body)
            .map_err(|e| io::Error::other(format!("LIST {}: {e}", self.root)))?;
        Ok(!page.contents.is_empty() || !page.common_prefixes.is_empty())
    }
}

impl Store for S3Store {
    type Dir = S3Dir;
    type Reader = S3Reader;
    type Writer = S3Writer;

    fn open_root(&self) -> io::Result<Option<(S3Dir, Meta)>> {
        let url = HeadBucket::new(&self.c.bucket, self.c.creds()).sign(SIGN_TTL);
        self.c
            .send("HEAD", "", || self.c.agent.head(url.as_str()).call())?;
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
        _rel: &[u8],
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        out.clear();
        // (name, size, LastModified, version fingerprint)
        let mut files = Vec::new();
        // Names that are also prefixes (`a` and `a/...`): directories here.
        let mut prefixes: Vec<String> = Vec::new();
        for page in self.list_dir_pages(&dir.prefix)? {
            for c in page.contents {
                let name = &c.key[dir.prefix.len().min(c.key.len())..];
                // A "directory marker" object (the prefix itself) is not an entry.
                if name.is_empty() || !c.key.starts_with(&dir.prefix) {
                    continue;
                }
                if name == "." || name == ".." {
                    errors.push(self.unnamable(name, &c.key));
                    continue;
                }
                let lm = c.last_modified.as_deref().and_then(parse_http_or_iso_date);
                let v = version(c.etag.as_deref(), lm);
                files.push((name.to_string(), c.size.unwrap_or(0), lm, v));
            }
            for p in page.common_prefixes {
                let raw = &p.prefix[dir.prefix.len().min(p.prefix.len())..];
                let name = raw.trim_end_matches('/');
                if matches!(raw, "/" | "./" | "../") {
                    // `a//b`, `a/./b`, `a/../b`: no file path can name them.
                    errors.push(self.unnamable(raw, &p.prefix));
                    continue;
                }
                if name.is_empty() {
                    continue;
                }
                out.push(name.as_bytes(), dir_meta());
                prefixes.push(name.to_string());
            }
        }
        if !prefixes.is_empty() && !files.is_empty() {
            // An object `a` beside objects `a/...`: a tree cannot have a file
            // and a directory of one name. The directory is kept (it holds
            // more), the object reported and left alone.
            prefixes.sort_unstable();
            files.retain(|(name, ..)| {
                if prefixes.binary_search(name).is_err() {
                    return true;
                }
                let key = format!("{}{name}", dir.prefix);
                errors.push(ListError {
                    name: name.as_bytes().to_vec(),
                    err: io::Error::other(format!(
                        "is both an object and a prefix (s3://{b}/{key} and s3://{b}/{key}/...): skipped the object",
                        b = self.c.bucket.name()
                    )),
                });
                false
            });
        }
        if self.lazy_meta {
            // Size exact, mtime from LastModified until `refine` asks.
            for (name, size, lm, v) in &files {
                let (mtime_sec, mtime_nsec) = lm.unwrap_or((0, 0));
                out.push(
                    name.as_bytes(),
                    Meta {
                        kind: Kind::File,
                        size: *size,
                        mtime_sec,
                        mtime_nsec,
                        mode: 0o644,
                        uid: 0,
                        gid: 0,
                        ino: 0,
                        version: *v,
                    },
                );
            }
            out.sort();
            return Ok(());
        }
        // mtime and mode live in object metadata, which listings do not
        // return: HEAD every object, several at a time.
        let args: Vec<HeadArg<'_>> = files
            .iter()
            .map(|(n, s, lm, _)| (n.as_str(), *s, *lm))
            .collect();
        for (i, r) in self.head_many(&dir.prefix, &args).into_iter().enumerate() {
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

    fn approximate_meta(&self) -> bool {
        self.lazy_meta
    }

    fn has_inodes(&self) -> bool {
        false
    }

    fn meta_after_commit(&self, written: &Meta) -> Option<Meta> {
        // Size, and mtime and mode in the object's metadata, as written
        // (x-amz-meta-mtime keeps nanoseconds); the listed version is
        // learnt from the next listing.
        (written.kind == Kind::File).then_some(Meta {
            uid: 0,
            gid: 0,
            ino: 0,
            version: 0,
            mode: written.mode & 0o7777,
            ..*written
        })
    }

    fn refine(
        &self,
        dir: &S3Dir,
        list: &mut Listing,
        which: &[usize],
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        // The listed mtime is the LastModified: the fallback of objects
        // without ferry's or rclone's metadata.
        let names: Vec<(String, u64, (i64, u32))> = which
            .iter()
            .map(|&i| {
                let e = &list.entries()[i];
                let m = &e.meta;
                let name = String::from_utf8_lossy(list.name(e)).into_owned();
                (name, m.size, (m.mtime_sec, m.mtime_nsec))
            })
            .collect();
        let args: Vec<HeadArg<'_>> = names
            .iter()
            .map(|(n, s, lm)| (n.as_str(), *s, Some(*lm)))
            .collect();
        let results = self.head_many(&dir.prefix, &args);
        for (k, r) in results.into_iter().enumerate() {
            match r {
                Ok(m) => {
                    // The listing's version fingerprint stays.
                    let e = &mut list.entries_mut()[which[k]];
                    e.meta = Meta {
                        version: e.meta.version,
                        ..m
                    };
                }
                Err(err) => errors.push(ListError {
                    name: names[k].0.as_bytes().to_vec(),
                    err,
                }),
            }
        }
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
        Ok(S3Reader {
            c: self.c.clone(),
            key: self.key(dir, name)?,
            body: None,
            ident: OnceLock::new(),
            meta: OnceLock::new(),
            md5: OnceLock::new(),
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
            copy_from: None,
        })
    }

    fn write_from(
        &self,
        _dir: &S3Dir,
        w: &mut S3Writer,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        if let Some(r) = src.as_any().and_then(|a| a.downcast_ref::<S3Reader>()) {
            if r.body.is_none() && r.c.same_server(&self.c) {
                // Same server: copied there at commit, no bytes through us.
                // The HEAD gives the engine the source's exact metadata.
                r.identity()?;
                let source = format!("/{}/{}", r.c.bucket.name(), encode_key(&r.key));
                w.copy_from = Some((source, size, r.md5.get().cloned()));
                return Ok(size);
            }
        }
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
                // Too big for one PUT: parallel multipart from here on. The
                // upload's metadata is set now: take the source's exact one.
                if let Some(m) = src.meta() {
                    w.meta = Meta {
                        kind: w.meta.kind,
                        ..m
                    };
                }
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
        meta: &Meta,
        _fsync: bool,
    ) -> io::Result<()> {
        let mut w = w;
        w.meta = *meta;
        if let Some((source, size, md5)) = w.copy_from.take() {
            self.c
                .counters
                .server_copies
                .fetch_add(1, Ordering::Relaxed);
            return self.copy_object(&w.key, &source, size, &w.meta, md5.as_deref());
        }
        match w.upload.take() {
            None => self.put(&w.key, &w.buf, &w.meta),
            Some(up) => {
                self.complete(&w.key, &up.id, &up.etags)?;
                // The upload was started by an earlier run: its metadata is
                // that run's. Fix it if the file's changed since.
                let now = if up.resumed {
                    Some(self.head(&w.key, 0, None)?)
                } else {
                    None
                };
                let stale = now
                    .as_ref()
                    .is_some_and(|n| !n.same_mtime(&w.meta) || n.mode != w.meta.mode);
                // The whole file's MD5 is known only now: it goes into the
                // metadata by a copy onto itself (on the server, no data
                // through us), up to the size one CopyObject can copy.
                let size = now.map_or(w.meta.size, |n| n.size);
                let md5 = up.md5.as_deref().filter(|_| size <= COPY_MAX);
                if stale || md5.is_some() {
                    self.copy_object(&w.key, &self.source_of(&w.key), size, &w.meta, md5)?;
                }
                Ok(())
            }
        }
    }

    fn abort(&self, _dir: &S3Dir, _w: S3Writer) {
        // A started multipart upload stays on the server: the next upload
        // of this key resumes it (parts already there are not sent again),
        // and `ferry cleanup` removes the ones nobody comes back for.
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
        // Server-side copy onto itself with replaced metadata: no data
        // moves. rclone's MD5 of the object stays (the content does).
        let key = self.key(dir, name)?;
        let (_, md5) = self.head_md5(&key, 0, None)?;
        self.copy_object(&key, &self.source_of(&key), meta.size, meta, md5.as_deref())
    }

    fn hashes(&self) -> HashSet {
        HashSet::of(&[HashKind::Md5])
    }

    fn hash(&self, dir: &S3Dir, name: &CStr, kind: HashKind) -> io::Result<Option<Hash>> {
        // A single-part ETag is the MD5; a multipart object's MD5 is the
        // `X-Amz-Meta-Md5chksum` ferry and rclone record, when there.
        let HashKind::Md5 = kind;
        let (tag, md5) = self.etag_md5(dir, name)?;
        let from_meta = || {
            use base64::Engine as _;
            let d = base64::prelude::BASE64_STANDARD.decode(md5?).ok()?;
            d.try_into().ok()
        };
        Ok(tag
            .as_deref()
            .and_then(etag::single_md5)
            .or_else(from_meta)
            .map(Hash::Md5))
    }

    fn matches_bytes<'a>(
        &self,
        dir: &S3Dir,
        name: &CStr,
        size: u64,
        open: &mut dyn FnMut() -> io::Result<Box<dyn SourceFile + 'a>>,
    ) -> io::Result<Option<bool>> {
        let Some(tag) = self.etag_md5(dir, name)?.0 else {
            return Ok(None);
        };
        // Another object: equal ETags are the same content, and nothing is
        // read to tell other ones apart (its bytes are compared instead).
        let other = open()?;
        if let Some(o) = other.as_any().and_then(|a| a.downcast_ref::<S3Reader>()) {
            let (_, theirs) = o.identity()?;
            return Ok((theirs.trim_matches('"').eq_ignore_ascii_case(&tag)).then_some(true));
        }
        drop(other);
        etag::matches(open, size, &tag)
    }

    fn remove(&self, dir: &S3Dir, name: &CStr, is_dir: bool) -> io::Result<u64> {
        if !is_dir {
            self.delete_key(&self.key(dir, name)?)?;
            return Ok(1);
        }
        self.remove_each(dir, name, &mut |_, _| {})
    }

    fn remove_each(
        &self,
        dir: &S3Dir,
        name: &CStr,
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64> {
        // Every object under the prefix, a page (one DeleteObjects) at a
        // time; the prefix itself is counted last, like a directory.
        let prefix = format!("{}/", self.key(dir, name)?);
        let mut n = 0;
        let mut token: Option<String> = None;
        loop {
            let page = self.list_page(&prefix, false, token.as_deref())?;
            let keys: Vec<String> = page.contents.iter().map(|c| c.key.clone()).collect();
            self.delete_keys(&keys)?;
            for c in &page.contents {
                // A directory marker (the prefix itself) is the directory.
                let rel = c.key.get(prefix.len()..).unwrap_or("");
                if !rel.is_empty() {
                    each(rel.as_bytes(), c.size.unwrap_or(0));
                    n += 1;
                }
            }
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        each(b"", 0);
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
        // The source's own metadata goes with it (and objects over 5 GiB
        // are copied in parts).
        let (meta, md5) = match self.head_md5(&from, 0, None) {
            // A directory: a prefix, whose objects would move one by one.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && !self
                        .list_page(&format!("{from}/"), false, None)?
                        .contents
                        .is_empty() =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{from}/: S3 cannot rename a prefix"),
                ));
            }
            r => r?,
        };
        self.copy_object(
            &to,
            &self.source_of(&from),
            meta.size,
            &meta,
            md5.as_deref(),
        )?;
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

    fn latency_bound(&self) -> bool {
        true
    }

    fn keeps_empty_dirs(&self) -> bool {
        false
    }

    fn notes(&self, role: &str) -> Vec<String> {
        let c = self.counters();
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![format!(
            "s3 {role}: {} HEAD requests, {} parts sent, {} parts reused from {} resumed upload(s), {} server-side copies, {} stale upload(s) aborted, {} ranged GETs on the direct path, {} sent again through the HTTP client, {} listing ranges in parallel, {} batch deletes",
            n(&c.heads),
            n(&c.parts_sent),
            n(&c.parts_reused),
            n(&c.uploads_resumed),
            n(&c.server_copies),
            n(&c.uploads_aborted),
            n(&c.direct_gets),
            n(&c.direct_fallbacks),
            n(&c.list_ranges),
            n(&c.batch_deletes)
        )]
    }

    fn cleanup(&self, max_age: Duration, dry_run: bool) -> io::Result<Vec<(String, String)>> {
        // The bucket must exist (an error naming it otherwise).
        self.open_root()?;
        let bucket = self.c.bucket.name();
        Ok(S3Store::cleanup(self, max_age, dry_run)?
            .into_iter()
            .map(|(key, started)| (format!("s3://{bucket}/{key}"), started))
            .collect())
    }
}

impl SourceFile for S3Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.body.is_none() {
            let url = GetObject::new(&self.c.bucket, self.c.creds(), &self.key).sign(SIGN_TTL);
            let resp = self
                .c
                .send("GET", &self.key, || self.c.agent.get(url.as_str()).call())?;
            if resp.headers().contains_key(META_MTIME) {
                let _ = self.meta.set(meta_from_headers(resp.headers(), 0, None));
            }
            self.body = Some(resp.into_body().into_reader());
        }
        self.body.as_mut().expect("opened").read(buf)
    }

    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    fn ranged(&self) -> Option<&dyn RangedSource> {
        Some(self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }

    fn meta(&self) -> Option<Meta> {
        self.meta.get().copied()
    }
}

impl S3Reader {
    /// A ranged GET through ureq (retrying what `Conn::send` retries): the
    /// body of a `206`, or of a `200` for a range from the start.
    fn get_range_ureq(
        &self,
        url: &url::Url,
        range: &str,
        etag: &str,
        at: u64,
    ) -> io::Result<ureq::BodyReader<'static>> {
        // `If-Match`: every range comes from the same version, or the
        // request fails (412) instead of mixing two versions.
        let resp = self.c.send("GET", &self.key, || {
            let mut r = self.c.agent.get(url.as_str()).header("range", range);
            if !etag.is_empty() {
                r = r.header("if-match", etag);
            }
            r.call()
        })?;
        if resp.status().as_u16() != 206 && at != 0 {
            return Err(io::Error::other(format!(
                "GET {}: the server ignored the byte range (HTTP {})",
                self.key,
                resp.status().as_u16()
            )));
        }
        Ok(resp.into_body().into_reader())
    }
}

impl RangedSource for S3Reader {
    fn identity(&self) -> io::Result<(u64, String)> {
        if let Some(v) = self.ident.get() {
            return Ok(v.clone());
        }
        let url = HeadObject::new(&self.c.bucket, self.c.creds(), &self.key).sign(SIGN_TTL);
        let resp = self
            .c
            .send("HEAD", &self.key, || self.c.agent.head(url.as_str()).call())?;
        let h = resp.headers();
        // Without ferry's or rclone's metadata the listing's LastModified
        // (milliseconds) is better than this header's (seconds).
        if h.contains_key(META_MTIME) {
            let _ = self.meta.set(meta_from_headers(h, 0, None));
        }
        if let Some(m) = md5_from_headers(h) {
            let _ = self.md5.set(m);
        }
        let size = h
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .ok_or_else(|| io::Error::other(format!("HEAD {}: no Content-Length", self.key)))?;
        let etag = h
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        Ok(self.ident.get_or_init(|| (size, etag)).clone())
    }

    fn read_range(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
        limit: Option<&Limiter>,
    ) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (_, etag) = self.identity()?;
        let url = GetObject::new(&self.c.bucket, self.c.creds(), &self.key).sign(SIGN_TTL);
        let end = offset + len;
        let mut at = offset;
        // Pieces sit aligned in memory and end on 4 KiB boundaries of the
        // object, so the writer can send them to disk with O_DIRECT.
        with_piece_buffer(|buf| {
            let mut attempt = 0;
            loop {
                if let Some(why) = self.c.health.gone() {
                    return Err(self.c.unreachable(why));
                }
                attempt += 1;
                let range = format!("bytes={}-{}", at, end - 1);
                let mut direct_body;
                let mut ureq_body;
                let body: &mut dyn Read = match self
                    .c
                    .direct
                    .as_ref()
                    .filter(|d| d.is_on())
                    .map(|d| d.get(&url, at, end, &etag))
                {
                    Some(Ok(direct::Get::Body(b))) => {
                        self.c.health.note(Reach::Answered);
                        self.c.counters.direct_gets.fetch_add(1, Ordering::Relaxed);
                        direct_body = b;
                        &mut direct_body
                    }
                    // No connection or no answer: like a connection broken
                    // mid-body, ask again after a pause.
                    Some(Err(e)) => {
                        let (reach, msg) = fail::io_reach(&e, &self.c.endpoint, self.c.timeout);
                        self.c.note(reach, msg.starts_with("no answer"));
                        if attempt < ATTEMPTS {
                            backoff(attempt);
                            continue;
                        }
                        if reach == Reach::Failed {
                            let why = self.c.short_cause(&msg);
                            if self.c.health.gave_up(&why) {
                                return Err(self
                                    .c
                                    .unreachable(self.c.health.gone().unwrap_or(&why)));
                            }
                        }
                        let url = self.c.url_of(&self.key);
                        return Err(io::Error::other(format!("GET {url} ({range}): {msg}")));
                    }
                    other => {
                        if other.is_some() {
                            self.c
                                .counters
                                .direct_fallbacks
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        ureq_body = self.get_range_ureq(&url, &range, &etag, at)?;
                        &mut ureq_body
                    }
                };
                // Gather up to a full piece per hand-over (few, large writes).
                let res = loop {
                    if at == end {
                        // Read the end of the body too: only then does the
                        // connection go back to the pool for the next range.
                        let mut last = [0u8; 1];
                        match body.read(&mut last) {
                            Ok(0) => break Ok(()),
                            Ok(_) => break Err(io::Error::other("longer than the range asked")),
                            Err(e) => break Err(e),
                        }
                    }
                    let want = piece_len(at, end, limit.map_or(buf.len(), |l| l.chunk()));
                    let mut n = 0;
                    let mut broke: Option<io::Error> = None;
                    while n < want {
                        match body.read(&mut buf[n..want]) {
                            Ok(0) => {
                                broke = Some(io::ErrorKind::UnexpectedEof.into());
                                break;
                            }
                            Ok(k) => n += k,
                            Err(e) => {
                                broke = Some(e);
                                break;
                            }
                        }
                    }
                    // What arrived counts, even if the connection broke after.
                    if n > 0 {
                        if let Some(l) = limit {
                            l.acquire(n as u64);
                        }
                        out(at, &buf[..n])?;
                        at += n as u64;
                    }
                    if let Some(e) = broke {
                        break Err(e);
                    }
                };
                match res {
                    Ok(()) => return Ok(()),
                    // The connection broke mid-body: ask for the rest again.
                    Err(_) if attempt < ATTEMPTS => backoff(attempt),
                    Err(e) => {
                        return Err(io::Error::other(format!("GET {} ({range}): {e}", self.key)))
                    }
                }
            }
        })
    }
}

/// How many bytes to gather for the piece at `at` of a range ending at
/// `end`: at most `max` (and [`RANGE_PIECE`]), ending on a
/// [`DIRECT_ALIGN`] boundary of the object unless the range ends first.
fn piece_len(at: u64, end: u64, max: usize) -> usize {
    const A: u64 = DIRECT_ALIGN as u64;
    let max = max.min(RANGE_PIECE) as u64;
    let mut want = (end - at).min(max);
    if !at.is_multiple_of(A) {
        // Up to the next boundary first (a range resumed mid-block).
        want = want.min(A - at % A);
    } else if at + want < end && want >= A {
        want -= want % A;
    }
    want as usize
}

/// Metadata of an object from a HEAD's or GET's headers: `x-amz-meta-mtime`
/// and `x-amz-meta-mode` when ferry or rclone wrote them, else LastModified.
fn meta_from_headers(h: &ureq::http::HeaderMap, size: u64, fallback: Option<(i64, u32)>) -> Meta {
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let size = get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(size);
    let (mtime_sec, mtime_nsec) = get(META_MTIME)
        .and_then(parse_mtime)
        .or(fallback)
        .or_else(|| get("last-modified").and_then(parse_http_or_iso_date))
        .unwrap_or((0, 0));
    let mode = get(META_MODE)
        .and_then(|m| u32::from_str_radix(m, 8).ok())
        .map_or(0o644, |m| m & 0o7777);
    Meta {
        kind: Kind::File,
        size,
        mtime_sec,
        mtime_nsec,
        mode,
        uid: 0,
        gid: 0,
        ino: 0,
        version: 0,
    }
}

/// `X-Amz-Meta-Md5chksum` of an object (rclone's whole-object MD5).
fn md5_from_headers(h: &ureq::http::HeaderMap) -> Option<String> {
    h.get(META_MD5)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A fingerprint of an object's version, kept in [`Meta::version`] of listed
/// objects: its ETag and LastModified as
/// listed (to the millisecond; a HEAD's has only seconds, so metadata from
/// a HEAD carries 0). A re-upload or a metadata rewrite changes it; 0 when
/// either is missing.
fn version(etag: Option<&str>, last_modified: Option<(i64, u32)>) -> u64 {
    let (Some(etag), Some((s, ns))) = (etag, last_modified) else {
        return 0;
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in etag
        .trim_matches('"')
        .bytes()
        .chain(s.to_le_bytes())
        .chain(ns.to_le_bytes())
    {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

/// One page of a listing, as [`S3Store::list`] reads it.
struct ListPage {
    contents: Vec<rusty_s3::actions::list_objects_v2::ListObjectsContent>,
    common_prefixes: Vec<rusty_s3::actions::list_objects_v2::CommonPrefixes>,
    next: Option<String>,
}

impl From<rusty_s3::actions::ListObjectsV2Response> for ListPage {
    fn from(r: rusty_s3::actions::ListObjectsV2Response) -> Self {
        ListPage {
            contents: r.contents,
            common_prefixes: r.common_prefixes,
            next: r.next_continuation_token,
        }
    }
}

/// Boundaries (names, rising, all after the page's last name) to cut the
/// rest of a wide listing into about `want` ranges, guessed from its first
/// page `names` (in order): where the page's first and last names first
/// differ, at position `d`, the page went through the characters seen
/// there; the names after it should move one position to the left first,
/// then two, …: a boundary is the last name up to position `p < d` with
/// its byte at `p` replaced by a larger one among those seen at `d`,
/// outer positions (the widest ranges) first until there are `want`.
/// `f000000`…`f000999` gives `f01`…`f09` and `f1`…`f9`. Only ASCII
/// positions are used (a boundary must be valid UTF-8). Empty when nothing
/// can be guessed.
fn split_points(names: &[&str], want: usize) -> Vec<String> {
    let (Some(first), Some(last)) = (names.first(), names.last()) else {
        return Vec::new();
    };
    let (f, l) = (first.as_bytes(), last.as_bytes());
    let Some(d) = f.iter().zip(l).position(|(a, b)| a != b) else {
        return Vec::new();
    };
    let mut seen: Vec<u8> = names
        .iter()
        .filter_map(|n| n.as_bytes().get(d).copied())
        .filter(|c| c.is_ascii() && *c != b'/')
        .collect();
    seen.sort_unstable();
    seen.dedup();
    // Outer positions first: their ranges are the widest.
    let mut out: Vec<String> = Vec::new();
    for p in 0..d {
        if !l[..=p].is_ascii() || out.len() >= want {
            break;
        }
        for &c in seen.iter().filter(|&&c| c > l[p]) {
            let mut b = l[..p].to_vec();
            b.push(c);
            out.push(String::from_utf8(b).expect("ASCII"));
        }
    }
    out.sort();
    out.dedup();
    out
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
        version: 0,
    }
}

fn read_body(resp: &mut Response<Body>) -> io::Result<String> {
    resp.body_mut()
        .with_config()
        .limit(256 << 20)
        .read_to_string()
        .map_err(io::Error::other)
}

/// The kind of an error status, and `HTTP 404 NoSuchKey: message`.
fn status_detail(status: u16, code: &str, body: &str) -> (io::ErrorKind, String) {
    let kind = match status {
        404 => io::ErrorKind::NotFound,
        401 | 403 => io::ErrorKind::PermissionDenied,
        501 => io::ErrorKind::Unsupported,
        _ if code == "NotImplemented" => io::ErrorKind::Unsupported,
        _ => io::ErrorKind::Other,
    };
    let msg = xml_field(body, "Message").unwrap_or_default();
    let detail = match (code.is_empty(), msg.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!(" {code}"),
        (false, false) => format!(" {code}: {msg}"),
    };
    (kind, format!("HTTP {status}{detail}"))
}

/// A ListParts answer: number → (size, ETag) of its `<Part>` elements, and
/// the next part number marker when the listing is truncated. `None` when
/// a part lacks its number, size or ETag.
fn parse_parts(body: &str) -> Option<(Parts, Option<u16>)> {
    let mut parts = HashMap::new();
    for p in xml_blocks(body, "Part") {
        let n: u16 = xml_field(p, "PartNumber")?.trim().parse().ok()?;
        let size: u64 = xml_field(p, "Size")?.trim().parse().ok()?;
        let etag = xml_unescape(xml_field(p, "ETag")?.trim());
        parts.insert(n, (size, etag));
    }
    let truncated = xml_field(body, "IsTruncated").is_some_and(|t| t.trim() == "true");
    let next = xml_field(body, "NextPartNumberMarker").and_then(|m| m.trim().parse().ok());
    Some((parts, next.filter(|_| truncated)))
}

/// The text of the first `<name>...</name>` element (S3 error bodies).
fn xml_field(body: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&format!("</{name}>"))? + start;
    Some(body[start..end].to_string())
}

/// The contents of every `<name>...</name>` element.
fn xml_blocks<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

fn xml_unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// Standard base64 with padding (`X-Amz-Meta-Md5chksum`).
fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::prelude::BASE64_STANDARD.encode(data)
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
    if m.mtime_sec < 0 && m.mtime_nsec > 0 {
        // -2 s + 0.5 s is -1.5 s.
        return format!(
            "-{}.{:09}",
            -(m.mtime_sec + 1),
            1_000_000_000 - m.mtime_nsec
        );
    }
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
    if s.starts_with('-') && nsec > 0 {
        // "-1.5" is 1.5 s before the epoch: -2 s + 0.5 s ("-0.5": -1 s + 0.5 s).
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

/// Refuse a key with a `.` or `..` segment (`a/../b`, `a/.`): URLs are
/// normalised (RFC 3986, WHATWG; `%2E` too) as they are built, so the
/// request would reach another key, or the bucket itself. No file path can
/// hold such a key either: listings report them (see `S3Store::list`).
pub fn check_key(key: &str) -> io::Result<()> {
    match key.split('/').find(|s| *s == "." || *s == "..") {
        None => Ok(()),
        Some(seg) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{key}: a key with a \"{seg}\" segment cannot be requested exactly (URLs remove such segments)"),
        )),
    }
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
mod split_tests {
    use super::split_points;

    #[test]
    fn counters_move_left() {
        let names: Vec<String> = (0..1000).map(|i| format!("f{i:06}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let b = split_points(&refs, 15);
        let want: Vec<String> = (1..10)
            .map(|i| format!("f0{i}"))
            .chain((1..10).map(|i| format!("f{i}")))
            .collect();
        assert_eq!(b, want);
    }

    #[test]
    fn hashes_split_on_the_first_byte() {
        let names: Vec<String> = (0..256).map(|i| format!("0{:02x}{}", i, "ab")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let b = split_points(&refs, 15);
        assert_eq!(b.len(), 15, "{b:?}");
        assert!(b.iter().all(|x| x.as_str() > "0ffab"));
        assert!(b.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn nothing_to_guess() {
        assert!(split_points(&[], 8).is_empty());
        assert!(split_points(&["same", "same"], 8).is_empty());
        // Differing only in a non-ASCII part: no valid boundary.
        assert!(split_points(&["é1", "é2"], 8).is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_end_on_block_boundaries() {
        let a = DIRECT_ALIGN as u64;
        let big = 64 << 20;
        assert_eq!(piece_len(0, big, usize::MAX), RANGE_PIECE);
        // Mid-block: up to the boundary, then whole pieces.
        assert_eq!(piece_len(a + 10, big, usize::MAX), a as usize - 10);
        // A limiter's odd chunk is cut to whole blocks...
        assert_eq!(piece_len(0, big, 20_000), 4 * a as usize);
        // ...except at the end of the range.
        assert_eq!(piece_len(big - 100, big, 20_000), 100);
        assert_eq!(piece_len(0, 5000, usize::MAX), 5000);
        // A limiter chunk below a block is kept.
        assert_eq!(piece_len(0, big, 1000), 1000);
    }

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
            version: 0,
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
        for (sec, nsec, text) in [(-2, 500_000_000, "-1.500000000"), (-1, 1, "-0.999999999")] {
            let m = Meta {
                mtime_sec: sec,
                mtime_nsec: nsec,
                ..m
            };
            assert_eq!(format_mtime(&m), text);
            assert_eq!(parse_mtime(text), Some((sec, nsec)));
        }
        assert_eq!(parse_mtime("-1"), Some((-1, 0)));
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
    fn keys_are_requested_exactly_or_not_at_all() {
        let b = Bucket::new(
            "http://127.0.0.1:1".parse().unwrap(),
            UrlStyle::Path,
            "b",
            "r",
        )
        .unwrap();
        // What `check_key` guards against: the URL of `trav/..` is the
        // bucket's own, that of `a/./x` is `a/x`'s.
        assert_eq!(b.object_url("trav/..").path(), "/b/");
        assert_eq!(b.object_url("a/./x").path(), "/b/a/x");
        for k in ["trav/..", "a/./x", "..", ".", "a/../b", "x/."] {
            assert!(check_key(k).is_err(), "{k}");
        }
        // Empty segments and dots inside names stay as they are.
        for (k, path) in [
            ("a//b", "/b/a//b"),
            ("/x", "/b//x"),
            ("a..b/.x/..y", "/b/a..b/.x/..y"),
            ("p/%2E%2E", "/b/p/%252E%252E"),
        ] {
            assert!(check_key(k).is_ok(), "{k}");
            assert_eq!(b.object_url(k).path(), path);
        }
    }

    #[test]
    fn list_parts_answers_read_whatever_their_root() {
        // moto's server: root `ListPartsResponse`, a next marker while not truncated.
        let moto = r#"<?xml version="1.0" encoding="utf-8"?>
<ListPartsResponse xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>b</Bucket><Key>k</Key><UploadId>u</UploadId><PartNumberMarker>0</PartNumberMarker><NextPartNumberMarker>1</NextPartNumberMarker><MaxParts>1000</MaxParts><IsTruncated>false</IsTruncated><Part><PartNumber>1</PartNumber><LastModified>2026-11-23T13:42:43.000Z</LastModified><ETag>"6da323ddf02915cabcfeca8b6e5eb306"</ETag><Size>6000000</Size></Part><Initiator><ID>x</ID></Initiator><StorageClass>STANDARD</StorageClass></ListPartsResponse>"#;
        let (parts, next) = parse_parts(moto).unwrap();
        assert_eq!(next, None);
        assert_eq!(
            parts[&1],
            (
                6_000_000,
                "\"6da323ddf02915cabcfeca8b6e5eb306\"".to_string()
            )
        );
        // The standard root, truncated, ETags escaped.
        let aws = "<ListPartsResult><IsTruncated>true</IsTruncated><NextPartNumberMarker>2</NextPartNumberMarker>\
<Part><PartNumber>1</PartNumber><ETag>&quot;aa&quot;</ETag><Size>5</Size></Part>\
<Part><PartNumber>2</PartNumber><ETag>&quot;bb&quot;</ETag><Size>6</Size></Part></ListPartsResult>";
        let (parts, next) = parse_parts(aws).unwrap();
        assert_eq!(next, Some(2));
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[&2], (6, "\"bb\"".to_string()));
        // A part without its size: unreadable (the caller starts afresh).
        assert!(
            parse_parts("<X><Part><PartNumber>1</PartNumber><ETag>a</ETag></Part></X>").is_none()
        );
        assert_eq!(parse_parts("<X></X>").unwrap().0.len(), 0);
    }

    #[test]
    fn base64_as_rclone_writes_it() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        // MD5 of "" as rclone's X-Amz-Meta-Md5chksum.
        assert_eq!(base64(&Md5::digest(b"")), "1B2M2Y8AsgTpgAmY7PhCfg==");
    }

    #[test]
    fn copy_source_encoding() {
        assert_eq!(encode_key("a b/c+d.txt"), "a%20b/c%2Bd.txt");
    }
}
