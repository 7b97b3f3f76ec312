//! Ranged GETs over plain `http://` without the HTTP client: the request
//! (signed exactly as ureq's would be) goes out on a kept-alive
//! `TcpStream`, the response head is parsed (httparse), and the body is
//! read from the socket straight into the caller's buffer. Through ureq
//! every body byte is copied once more, from its buffer into ours, and
//! scanned by its body state machine (see `ferry_local::download`).
//!
//! Only the plain case is handled: `206 Partial Content` with a
//! `Content-Length`, a `Content-Range` starting where asked, no transfer
//! coding. Anything else (an error status, chunked bodies, a proxy in the
//! environment, `https`) returns [`Get::Fallback`] and the caller sends the
//! request through ureq, with its retry and error handling. No
//! `splice(2)`: moving the body socket → pipe → file would save the one
//! copy left here but land in the page cache, whose copy of new pages
//! costs far more than the socket's (the file is written with `O_DIRECT`
//! from this buffer instead). Body reads set `SO_RCVLOWAT` so that the
//! thread wakes once per MiB received instead of once per arriving segment
//! (design notes: docs/DESIGN.md, S3).

use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a connect may take.
use crate::fail::CONNECT_TIMEOUT;
/// Largest response head read.
const HEAD_MAX: usize = 64 << 10;
/// Idle connections kept.
const IDLE_MAX: usize = 64;

/// Kept-alive connections to one `http://` endpoint.
pub(crate) struct Pool {
    /// `host:port` to connect to.
    addr: String,
    idle: Mutex<Vec<TcpStream>>,
    /// How long a request write or a response read may wait for a byte.
    io_timeout: Duration,
    /// Cleared once the server answered in a form this client does not
    /// handle (not an error status): from then on everything goes by ureq.
    on: AtomicBool,
}

/// The answer to a ranged GET.
pub(crate) enum Get<'a> {
    /// `206` with exactly the bytes asked for, to be read from here.
    Body(Body<'a>),
    /// Something this client does not handle: ask again through ureq.
    Fallback,
}

/// The body of a `206`: reads end (`Ok(0)`) after `Content-Length` bytes,
/// and then the connection goes back to the pool.
pub(crate) struct Body<'a> {
    pool: &'a Pool,
    stream: Option<TcpStream>,
    /// Body bytes read with the head.
    early: Vec<u8>,
    early_at: usize,
    /// Body bytes not read yet (`early` included).
    left: u64,
    keep_alive: bool,
    /// The socket's `SO_RCVLOWAT` now (1, the default, on pooled ones).
    lowat: usize,
}

impl Pool {
    /// A pool for `url` when it is plain `http` and no proxy is configured
    /// in the environment (ureq would use it).
    pub(crate) fn for_url(url: &url::Url, io_timeout: Duration) -> Option<Pool> {
        const PROXY_VARS: [&str; 6] = [
            "ALL_PROXY",
            "all_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
        ];
        if url.scheme() != "http" || PROXY_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
            return None;
        }
        let host = url.host_str()?;
        let port = url.port_or_known_default()?;
        let addr = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Some(Pool {
            addr,
            idle: Mutex::new(Vec::new()),
            io_timeout,
            on: AtomicBool::new(true),
        })
    }

    /// False once the server answered in a form this client does not handle.
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn connect(&self) -> io::Result<TcpStream> {
        let mut last = io::Error::other(format!("{}: no address", self.addr));
        let addrs: Vec<SocketAddr> = self.addr.to_socket_addrs()?.collect();
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(self.io_timeout))?;
                    s.set_write_timeout(Some(self.io_timeout))?;
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// GET `[start, end)` of the object at the signed `url`, only if its
    /// ETag is still `etag` (when not empty).
    pub(crate) fn get(
        &self,
        url: &url::Url,
        start: u64,
        end: u64,
        etag: &str,
    ) -> io::Result<Get<'_>> {
        let mut req = String::with_capacity(url.as_str().len() + 256);
        req.push_str("GET ");
        req.push_str(url.path());
        if let Some(q) = url.query() {
            req.push('?');
            req.push_str(q);
        }
        req.push_str(" HTTP/1.1\r\nHost: ");
        // As signed (rusty-s3) and sent (ureq): the port only when not 80.
        req.push_str(url.host_str().unwrap_or_default());
        if let Some(p) = url.port() {
            req.push_str(&format!(":{p}"));
        }
        req.push_str(&format!("\r\nRange: bytes={}-{}\r\n", start, end - 1));
        if !etag.is_empty() {
            req.push_str("If-Match: ");
            req.push_str(etag);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        // A kept-alive connection the server has closed in the meantime
        // fails before any byte of the answer: then once more on a new one.
        loop {
            let pooled = self.idle.lock().pop();
            let reused = pooled.is_some();
            let mut s = match pooled {
                Some(s) => s,
                None => self.connect()?,
            };
            let mut head = Vec::with_capacity(1024);
            match send_and_read_head(&mut s, req.as_bytes(), &mut head) {
                Ok(()) => return self.answer(s, head, start, end),
                Err(_) if reused && head.is_empty() => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Read the head in `buf` (the body's first bytes follow it).
    fn answer(&self, stream: TcpStream, buf: Vec<u8>, start: u64, end: u64) -> io::Result<Get<'_>> {
        // Another status (an error, or the range ignored): ureq asks again
        // and handles it. Another form: ureq from now on.
        let unsupported = || {
            self.on.store(false, Ordering::Relaxed);
            Ok(Get::Fallback)
        };
        let head = match parse_head(&buf) {
            Head::Complete(h) => h,
            Head::Partial => return Ok(Get::Fallback),
            Head::Invalid => return unsupported(),
        };
        if head.status != 206 {
            return Ok(Get::Fallback);
        }
        if head.coded || head.length != Some(end - start) || head.range != Some((start, end - 1)) {
            return unsupported();
        }
        let early = buf[head.len..].to_vec();
        if early.len() as u64 > end - start {
            return unsupported();
        }
        Ok(Get::Body(Body {
            pool: self,
            stream: Some(stream),
            early,
            early_at: 0,
            left: end - start,
            keep_alive: head.keep_alive,
            lowat: 1,
        }))
    }
}

/// What a response head says, as far as this client cares.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    /// Head length, blank line included.
    len: usize,
    length: Option<u64>,
    /// `Content-Range: bytes START-END/SIZE` as (START, END).
    range: Option<(u64, u64)>,
    /// A transfer coding or a content coding other than `identity`.
    coded: bool,
    keep_alive: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Head {
    Complete(Answer),
    /// More bytes needed.
    Partial,
    /// Not an HTTP/1.x response head (or more headers than read here).
    Invalid,
}

/// Parse the response head at the start of `buf` (httparse).
fn parse_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let len = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::Invalid,
    };
    let mut a = Answer {
        status: r.code.unwrap_or(0),
        len,
        length: None,
        range: None,
        coded: false,
        keep_alive: r.version == Some(1),
    };
    for h in r.headers.iter() {
        let Ok(v) = std::str::from_utf8(h.value) else {
            continue;
        };
        let (k, v) = (h.name, v.trim());
        if k.eq_ignore_ascii_case("content-length") {
            a.length = v.parse::<u64>().ok();
        } else if k.eq_ignore_ascii_case("transfer-encoding")
            || k.eq_ignore_ascii_case("content-encoding") && !v.eq_ignore_ascii_case("identity")
        {
            a.coded = true;
        } else if k.eq_ignore_ascii_case("content-range") {
            a.range = v
                .strip_prefix("bytes ")
                .and_then(|r| r.split_once('-'))
                .and_then(|(s, rest)| {
                    Some((s.parse().ok()?, rest.split_once('/')?.0.parse().ok()?))
                });
        } else if k.eq_ignore_ascii_case("connection") {
            for t in v.split(',') {
                if t.trim().eq_ignore_ascii_case("close") {
                    a.keep_alive = false;
                } else if t.trim().eq_ignore_ascii_case("keep-alive") {
                    a.keep_alive = true;
                }
            }
        }
    }
    Head::Complete(a)
}

/// Write the request, then read until the end of the response head (and
/// perhaps a little of the body) into `buf`.
fn send_and_read_head(s: &mut TcpStream, req: &[u8], buf: &mut Vec<u8>) -> io::Result<()> {
    s.write_all(req)?;
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if parse_head(buf) != Head::Partial {
            return Ok(());
        }
        if buf.len() > HEAD_MAX {
            return Err(io::Error::other("response head too long"));
        }
    }
}

/// Most bytes a body read waits for before it wakes up (`SO_RCVLOWAT`;
/// the kernel also grows the receive buffer to twice this).
const LOWAT_MAX: usize = 1 << 20;

/// The receive low mark with `left` bytes of body to come: a power of two
/// (it changes only near the end), at most half of them and `LOWAT_MAX`;
/// 1 (every byte wakes) below 16 KiB.
fn lowat_for(left: u64) -> usize {
    let half = usize::try_from(left / 2)
        .unwrap_or(usize::MAX)
        .min(LOWAT_MAX);
    if half < 16 << 10 {
        1
    } else {
        1 << half.ilog2()
    }
}

/// Set `SO_RCVLOWAT`: a blocking read returns once this many bytes (or the
/// amount asked for, if less) are in, after one wakeup instead of one per
/// arriving segment. Neither rustix nor std expose it.
#[allow(unsafe_code)]
fn set_rcvlowat(s: &TcpStream, bytes: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid socket descriptor, a pointer to a c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Read for Body<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || out.is_empty() {
            if self.left == 0 {
                self.release();
            }
            return Ok(0);
        }
        let want = out
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = if self.early_at < self.early.len() {
            let n = want.min(self.early.len() - self.early_at);
            out[..n].copy_from_slice(&self.early[self.early_at..self.early_at + n]);
            self.early_at += n;
            n
        } else {
            let Some(s) = self.stream.as_mut() else {
                return Err(io::ErrorKind::NotConnected.into());
            };
            // Wake up once this much has arrived instead of for every
            // segment. The kernel counts the mark in bytes not yet read
            // when data comes in, so a read that already took some bytes
            // waits for a whole mark more: at most half of what the body
            // has left, or the last read would wait for bytes that never
            // come. (A read asking for less than the mark returns what it
            // asked once the mark is in: the next one then need not wait.)
            let low = lowat_for(self.left);
            if low != self.lowat && set_rcvlowat(s, low).is_ok() {
                self.lowat = low;
            }
            match s.read(&mut out[..want]) {
                Ok(0) => {
                    self.stream = None;
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                Ok(n) => n,
                Err(e) => {
                    if e.kind() != io::ErrorKind::Interrupted {
                        self.stream = None;
                    }
                    return Err(e);
                }
            }
        };
        self.left -= n as u64;
        Ok(n)
    }
}

impl Drop for Body<'_> {
    fn drop(&mut self) {
        if self.left == 0 {
            self.release();
        }
    }
}

impl Body<'_> {
    /// The whole body was read: the connection can serve the next request.
    fn release(&mut self) {
        if let Some(s) = self.stream.take() {
            // The next answer's head is read with the default low mark.
            if self.keep_alive && (self.lowat == 1 || set_rcvlowat(&s, 1).is_ok()) {
                let mut idle = self.pool.idle.lock();
                if idle.len() < IDLE_MAX {
                    idle.push(s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowat_never_more_than_half_of_what_can_come() {
        assert_eq!(lowat_for(1 << 30), LOWAT_MAX);
        assert_eq!(lowat_for(300 << 10), 128 << 10);
        assert_eq!(lowat_for(20 << 10), 1);
        for left in (0..(3 * LOWAT_MAX) as u64).step_by(4099) {
            let l = lowat_for(left);
            assert!(l == 1 || (2 * l as u64 <= left && l <= LOWAT_MAX && l.is_power_of_two()));
        }
    }

    #[test]
    fn response_heads() {
        let h = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\
Content-Range: bytes 100-109/5000\r\nETag: \"x\"\r\n\r\nbody";
        let Head::Complete(a) = parse_head(h) else {
            panic!("complete")
        };
        assert_eq!(
            a,
            Answer {
                status: 206,
                len: h.len() - 4,
                length: Some(10),
                range: Some((100, 109)),
                coded: false,
                keep_alive: true
            }
        );
        assert_eq!(
            parse_head(b"HTTP/1.1 206 Partial Content\r\nContent-Le"),
            Head::Partial
        );
        assert_eq!(parse_head(b""), Head::Partial);
        assert_eq!(parse_head(b"SSH-2.0-OpenSSH\r\n\r\n"), Head::Invalid);
        // HTTP/1.0 closes unless asked to keep alive; names in any case.
        let Head::Complete(a) = parse_head(b"HTTP/1.0 206 x\r\nconnection: Keep-Alive\r\n\r\n")
        else {
            panic!("complete")
        };
        assert!(a.keep_alive);
        let Head::Complete(a) = parse_head(
            b"HTTP/1.1 206 x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
        ) else {
            panic!("complete")
        };
        assert!(!a.keep_alive && a.coded && a.length.is_none());
        let Head::Complete(a) =
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\n\r\n")
        else {
            panic!("complete")
        };
        assert!(a.status == 200 && !a.coded);
    }

    #[test]
    fn only_plain_http_without_proxy() {
        let https = url::Url::parse("https://s3.example.com/b/k").unwrap();
        assert!(Pool::for_url(&https, Duration::from_secs(1)).is_none());
        if std::env::var_os("HTTP_PROXY").is_none()
            && std::env::var_os("http_proxy").is_none()
            && std::env::var_os("ALL_PROXY").is_none()
            && std::env::var_os("all_proxy").is_none()
            && std::env::var_os("HTTPS_PROXY").is_none()
            && std::env::var_os("https_proxy").is_none()
        {
            let p = Pool::for_url(
                &url::Url::parse("http://127.0.0.1:3900/b/k").unwrap(),
                Duration::from_secs(1),
            );
            assert_eq!(p.unwrap().addr, "127.0.0.1:3900");
            let p = Pool::for_url(
                &url::Url::parse("http://[::1]/b/k").unwrap(),
                Duration::from_secs(1),
            );
            assert_eq!(p.unwrap().addr, "[::1]:80");
        }
    }
}
