//! Sending requests: the connection pool and signing, retries with
//! backoff, timeouts and the errors a failed request becomes.

use parking_lot::{Condvar, Mutex};
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusty_s3::{Bucket, Credentials, Method, S3Action};
use ureq::http::Response;
use ureq::{Body, SendBody};

use crate::direct;
use crate::fail::{self, Health, Reach, Unreachable};
use crate::store::S3Store;
use crate::xml::{self, ErrorBody};

/// How long a signed URL stays valid (one request).
pub(crate) const SIGN_TTL: Duration = Duration::from_secs(3600);

/// Attempts per request on retryable failures (5xx, SlowDown, resets, timeouts).
pub(crate) const ATTEMPTS: u32 = 6;

/// Request bodies from this size on are sent watched ([`Conn::watched`]):
/// smaller ones fit in the sockets' buffers, so that a server that stops
/// reading is seen by the wait for its answer (`--timeout` per read).
pub(crate) const WATCHED_BODY: usize = 64 << 10;

/// What a watched body hands to the connection at a time: the unit of its
/// progress.
const BODY_STEP: usize = 16 << 10;

/// The HTTP client of a store: no deadline on a whole request (a big part
/// on a slow link takes what it takes), but none waits more than `timeout`
/// for a byte, and a request body is watched ([`Conn::watched`]).
pub(crate) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(fail::CONNECT_TIMEOUT))
        .timeout_per_read(Some(timeout))
        .timeout_per_write(Some(timeout))
        .max_idle_connections(256)
        .max_idle_connections_per_host(256)
        .build()
        .into()
}

/// What every request needs: the bucket, the credentials and the pool of
/// keep-alive connections. Shared by the store and its readers.
pub(crate) struct Conn {
    pub(crate) bucket: Bucket,
    pub(crate) creds: Option<Credentials>,
    pub(crate) agent: ureq::Agent,
    /// Ranged GETs without ureq, for `http://` endpoints (see `direct`).
    pub(crate) direct: Option<direct::Pool>,
    pub(crate) counters: Counters,
    /// The endpoint as the user gave it (for messages).
    pub(crate) endpoint: String,
    /// `s3://bucket/prefix` of the store's root (for messages).
    pub(crate) root_url: String,
    /// No-progress timeout of a request (`--timeout`).
    pub(crate) timeout: Duration,
    /// Whether the endpoint answers (the unreachable rule).
    pub(crate) health: Health,
    /// Object metadata found unusable (said once per run).
    pub(crate) odd: crate::parse::OddMeta,
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

impl Conn {
    pub(crate) fn creds(&self) -> Option<&Credentials> {
        self.creds.as_ref()
    }

    /// True when `other` is the same server and account (server-side copy
    /// between them works).
    pub(crate) fn same_server(&self, other: &Conn) -> bool {
        let (a, b) = (self.bucket.base_url(), other.bucket.base_url());
        a.host_str() == b.host_str()
            && a.port_or_known_default() == b.port_or_known_default()
            && self.creds.as_ref().map(Credentials::key)
                == other.creds.as_ref().map(Credentials::key)
    }

    /// `s3://bucket/key` (`s3://bucket` for the bucket itself).
    pub(crate) fn url_of(&self, key: &str) -> String {
        if key.is_empty() {
            format!("s3://{}", self.bucket.name())
        } else {
            format!("s3://{}/{key}", self.bucket.name())
        }
    }

    /// The cause in a message about the endpoint, without the endpoint:
    /// `connection refused`, `no answer for 30 s`.
    pub(crate) fn short_cause(&self, msg: &str) -> String {
        msg.rsplit(": ")
            .next()
            .unwrap_or(msg)
            .replace(&format!(" from {}", self.endpoint), "")
    }

    /// The error of every request once the endpoint is unreachable.
    pub(crate) fn unreachable(&self, why: &str) -> io::Error {
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
    pub(crate) fn status_error(
        &self,
        what: &str,
        key: &str,
        status: u16,
        e: &ErrorBody,
    ) -> io::Error {
        let on_bucket = key.is_empty() || what == "LIST" || what == "ListMultipartUploads";
        let (kind, detail) = status_detail(status, e);
        let meaning = fail::meaning(status, &e.code, on_bucket);
        let (url, ep) = (self.url_of(key), &self.endpoint);
        let text = if meaning.is_empty() {
            format!("{what} {url}: {detail} (endpoint {ep})")
        } else {
            format!("{what} {url}: {meaning} ({detail}; endpoint {ep})")
        };
        if status == 412 {
            return io::Error::new(kind, Precondition(text));
        }
        io::Error::new(kind, text)
    }

    /// An attempt that could not reach the server (or reach it in time):
    /// noted in the endpoint's health; a stall is announced once.
    pub(crate) fn note_io(&self, what: &str, key: &str, e: &ureq::Error) -> (Reach, io::Error) {
        let (reach, msg) = fail::classify(e, &self.endpoint, self.timeout);
        self.note(reach, matches!(e, ureq::Error::Timeout(t) if *t != ureq::Timeout::Connect)
            || matches!(e, ureq::Error::Io(i) if matches!(i.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock)));
        (
            reach,
            io::Error::other(format!("{what} {}: {msg}", self.url_of(key))),
        )
    }

    pub(crate) fn note(&self, reach: Reach, stalled: bool) {
        self.health.note(reach);
        if stalled && self.health.first_stall() {
            eprintln!(
                "ferry: s3 {}: no answer for {} (retrying)",
                self.endpoint,
                fail::secs(self.timeout)
            );
        }
    }

    /// Sign `action` with `headers` (they are part of the signature) and
    /// [`send`](Self::send) it with them and `body` (none: an empty body
    /// for PUT and POST).
    pub(crate) fn call<'a, A: S3Action<'a>>(
        &self,
        what: &str,
        key: &str,
        mut action: A,
        headers: &[(&'static str, String)],
        body: Option<&[u8]>,
    ) -> io::Result<Response<Body>> {
        for (k, v) in headers {
            action.headers_mut().insert(*k, v.clone());
        }
        let url = action.sign(SIGN_TTL);
        let url = url.as_str();
        if let Some(b) = body.filter(|b| b.len() >= WATCHED_BODY) {
            let post = A::METHOD == Method::Post;
            return self.send(what, key, || self.watched(post, url, headers, b));
        }
        self.send(what, key, || match A::METHOD {
            Method::Put | Method::Post => {
                let mut r = match A::METHOD {
                    Method::Post => self.agent.post(url),
                    _ => self.agent.put(url),
                };
                for (k, v) in headers {
                    r = r.header(*k, v.as_str());
                }
                match body {
                    Some(b) => r.send(b),
                    None => r.send_empty(),
                }
            }
            m => {
                let mut r = match m {
                    Method::Head => self.agent.head(url),
                    Method::Delete => self.agent.delete(url),
                    _ => self.agent.get(url),
                };
                for (k, v) in headers {
                    r = r.header(*k, v.as_str());
                }
                r.call()
            }
        })
    }

    /// One attempt at a PUT (or POST) of `body`, watched: a kernel takes a
    /// few bytes now and then into the buffers of a server that reads
    /// nothing (a stopped one), which restarts the timeout of every write,
    /// so a stall would take several `--timeout`s to be seen. Instead the
    /// body goes to the connection [`BODY_STEP`] bytes at a time, and once
    /// no step was taken for `--timeout` (or no answer came that long after
    /// the last one) the attempt's connection is shut: it fails at once as
    /// a timeout. The attempt has its connection to itself (an agent of its
    /// own: shutting it touches no other request).
    fn watched(
        &self,
        post: bool,
        url: &str,
        headers: &[(&'static str, String)],
        body: &[u8],
    ) -> Result<Response<Body>, ureq::Error> {
        self.watched_with(&Watch::default(), post, url, headers, body)
    }

    /// [`watched`](Self::watched) with `watch`.
    fn watched_with(
        &self,
        watch: &Watch,
        post: bool,
        url: &str,
        headers: &[(&'static str, String)],
        body: &[u8],
    ) -> Result<Response<Body>, ureq::Error> {
        let agent = agent(self.timeout);
        let r = std::thread::scope(|s| {
            let dog = agent.clone();
            let w = watch;
            s.spawn(move || w.guard(self.timeout, dog));
            let mut r = if post {
                agent.post(url)
            } else {
                agent.put(url)
            };
            for (k, v) in headers {
                r = r.header(*k, v.as_str());
            }
            let mut steps = Steps {
                data: body,
                watch: w,
            };
            let r = r
                .header("content-length", body.len().to_string())
                .send(SendBody::from_reader(&mut steps));
            w.finish();
            r
        });
        if watch.fired.load(Ordering::Relaxed) {
            return Err(ureq::Error::Timeout(ureq::Timeout::SendBody));
        }
        r
    }

    /// A request used up its retries, the last attempt ending as `reach`
    /// with `msg`: the error of an endpoint declared unreachable, when it
    /// now is.
    pub(crate) fn gave_up(&self, reach: Reach, msg: &str) -> Option<io::Error> {
        if reach != Reach::Failed {
            return None;
        }
        let why = self.short_cause(msg);
        self.health
            .gave_up(&why)
            .then(|| self.unreachable(self.health.gone().unwrap_or(&why)))
    }

    /// Send a request, retrying transient failures with exponential backoff
    /// and jitter. `what` and `key` name the request in errors. Once the
    /// endpoint is unreachable (see [`fail::Health`]) every request fails
    /// at once with an [`Unreachable`] error.
    pub(crate) fn send(
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
                    let e = xml::error_body(&body).unwrap_or_default();
                    let code = e.code.as_str();
                    let err = self.status_error(what, key, status, &e);
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
                return Err(self.gave_up(reach, &retry.to_string()).unwrap_or(retry));
            }
            backoff(attempt);
        }
    }
}

impl S3Store {
    /// `f` of every item, on up to `head_threads` threads (at least
    /// `per_thread` items each), in the items' order: for requests that
    /// each wait on a round trip.
    pub(crate) fn in_parallel<T: Sync, R: Send>(
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

    /// Sign a GET on the bucket itself with `query` (for requests rusty-s3
    /// has no action for).
    pub(crate) fn sign_bucket_get(&self, query: &[(&str, &str)]) -> url::Url {
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
}

/// The progress of a request body being sent ([`Conn::watched`]).
#[derive(Default)]
struct Watch {
    /// When the connection last asked for a step of the body (none yet),
    /// and whether the exchange is over.
    state: Mutex<(Option<Instant>, bool)>,
    cv: Condvar,
    /// The connection was shut for want of progress.
    fired: AtomicBool,
}

impl Watch {
    fn step(&self) {
        let mut s = self.state.lock();
        if s.0.replace(Instant::now()).is_none() {
            self.cv.notify_all();
        }
    }

    fn finish(&self) {
        self.state.lock().1 = true;
        self.cv.notify_all();
    }

    /// Until the exchange is over: once the body has begun and no step
    /// came for `timeout`, shut `agent`'s connections (the write or read
    /// blocked on them fails at once).
    fn guard(&self, timeout: Duration, agent: ureq::Agent) {
        let mut s = self.state.lock();
        loop {
            match *s {
                (_, true) => return,
                (None, false) => self.cv.wait(&mut s),
                (Some(last), false) => {
                    let now = Instant::now();
                    let due = last + timeout;
                    if now >= due {
                        self.fired.store(true, Ordering::Relaxed);
                        drop(s);
                        agent.shutdown();
                        return;
                    }
                    self.cv.wait_for(&mut s, due - now);
                }
            }
        }
    }
}

/// A body handed over [`BODY_STEP`] bytes at a time, each step noted.
struct Steps<'a> {
    data: &'a [u8],
    watch: &'a Watch,
}

impl Read for Steps<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.watch.step();
        let n = buf.len().min(BODY_STEP).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

pub(crate) fn read_body(resp: &mut Response<Body>) -> io::Result<String> {
    resp.body_mut()
        .with_config()
        .limit(256 << 20)
        .read_to_string()
        .map_err(io::Error::other)
}

/// An HTTP 412 answer: a condition the request was sent with (`If-Match`,
/// `If-None-Match`) did not hold. Shown as the status error's text.
#[derive(Debug)]
pub(crate) struct Precondition(pub(crate) String);

impl std::fmt::Display for Precondition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Precondition {}

/// True for an error of an HTTP 412 answer ([`Precondition`]).
pub(crate) fn is_precondition(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Precondition>())
}

/// The kind of an error status, and `HTTP 404 NoSuchKey: message`.
pub(crate) fn status_detail(status: u16, e: &ErrorBody) -> (io::ErrorKind, String) {
    let (code, msg) = (e.code.as_str(), e.message.as_str());
    let kind = match status {
        404 => io::ErrorKind::NotFound,
        401 | 403 => io::ErrorKind::PermissionDenied,
        501 => io::ErrorKind::Unsupported,
        _ if code == "NotImplemented" => io::ErrorKind::Unsupported,
        _ => io::ErrorKind::Other,
    };
    let detail = match (code.is_empty(), msg.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!(" {code}"),
        (false, false) => format!(" {code}: {msg}"),
    };
    (kind, format!("HTTP {status}{detail}"))
}

pub(crate) fn backoff(attempt: u32) {
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

#[cfg(test)]
mod watch_tests {
    use std::net::TcpListener;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Watch, WATCHED_BODY};
    use crate::config::S3Config;
    use crate::store::S3Store;

    /// A server that accepts and then reads nothing (a stopped one): the
    /// attempt is ended by the body's watchdog, as a timeout, not left to
    /// the write timeout that each byte the kernel still takes restarts.
    #[test]
    fn a_body_nobody_reads_is_cut_by_the_watchdog() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        // The connection is accepted and kept, unread, until the test ends.
        let (tx, held) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(l.accept().unwrap().0));
        let cfg = S3Config {
            endpoint: url::Url::parse(&endpoint).unwrap(),
            region: "garage".into(),
            bucket: "b".into(),
            prefix: String::new(),
            credentials: None,
            path_style: true,
        };
        let mut store = S3Store::new(&cfg, 1).unwrap();
        Arc::get_mut(&mut store.c).unwrap().timeout = Duration::from_millis(500);
        // More than the sockets' buffers take.
        let body = vec![7u8; 64 << 20];
        assert!(body.len() >= WATCHED_BODY);
        let url = format!("{endpoint}/b/k");
        let watch = Watch::default();
        let r = store.c.watched_with(&watch, false, &url, &[], &body);
        assert!(
            matches!(r, Err(ureq::Error::Timeout(ureq::Timeout::SendBody))),
            "{r:?}"
        );
        assert!(watch.fired.load(Ordering::Relaxed), "the watchdog ended it");
        drop(held.recv());
    }
}
