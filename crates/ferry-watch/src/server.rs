//! The HTTP server of `--status`: the page, `/metrics`, `/status.json`.
//!
//! One thread blocked in `accept()`; each connection is answered on a
//! thread of its own (at most [`MAX_CONNS`] at once: beyond, a `503` at
//! once), so a slow client stalls no other. A request's head must be
//! complete within [`HEAD_DEADLINE`] of its connection (however slowly
//! it trickles in: the deadline is not reset by each byte) and within
//! [`MAX_HEAD`] bytes; it is parsed with `httparse` (hyper's parser).
//! Then, in this order:
//! - the `Host` header must name the bound address: its IP and port, or
//!   `localhost` (or this host's name) and its port; anything else is a
//!   `421` (a page of another site reaching a loopback server by DNS
//!   rebinding names that site); a request without `Host` is HTTP/1.0's
//!   and is let through.
//! - with a token, `Authorization: Bearer TOKEN` (the scheme in any case)
//!   or `?token=TOKEN`, compared in constant time; else `401` with
//!   `WWW-Authenticate: Bearer realm="ferry"`.
//! - `GET` and `HEAD` only (`405` with `Allow`); one request per
//!   connection (`Connection: close`).
//!
//! Why not a crate (checked in each crate's source, issue 30): the
//! requirement none of the runtime-free servers meets is the deadline for
//! a request's head (one client trickling its head must neither hold a
//! worker for ever nor be answered before the token check):
//! - tiny_http 0.12.0 (its last release, May 2023): `ServerConfig` holds
//!   an address and TLS only; the head is read byte by byte
//!   (`ClientConnection::read_next_line`) with no timeout, on a pool
//!   thread, before the request is handed out; no cap on connections.
//! - rouille 3.6: tiny_http 0.12 underneath, the same.
//! - astra 0.4.0 (hyper 1 on its own mio loop): no timer, so hyper's
//!   `header_read_timeout` cannot be set; its builder has no deadline
//!   of its own; a connection holds a worker while its head trickles.
//! - may_minihttp: no timeout anywhere in its source, on the `may`
//!   coroutine runtime; it parses with httparse, as this file does.
//! - hyper 1 has `header_read_timeout`, but only with a `Timer`, i.e.
//!   with tokio (plus hyper-util) in a binary that has no async runtime
//!   and is shipped to ssh hosts.
//!
//! So the head is parsed by `httparse` (hyper's parser) and the rest is
//! the ~150 lines below, each rule tested (`server::tests`,
//! `tests/it/watch_status.rs`).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Status;

/// Connections answered at once.
pub const MAX_CONNS: usize = 32;
/// How long a client has to send a request's head.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// The largest request head taken.
pub const MAX_HEAD: usize = 16 << 10;

/// Serve `status` on `addr` from a thread; with `token`, every request must
/// carry it. Returns the address bound.
pub fn serve(
    addr: SocketAddr,
    token: Option<String>,
    status: Arc<Status>,
) -> io::Result<SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let bound = l.local_addr()?;
    let ctx = Arc::new(Ctx {
        bound,
        token,
        status,
        names: host_names(),
        live: AtomicUsize::new(0),
    });
    std::thread::Builder::new()
        .name("ferry-status".into())
        .spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else {
                    // EMFILE and the like: let them pass.
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                if ctx.live.fetch_add(1, Ordering::AcqRel) >= MAX_CONNS {
                    ctx.live.fetch_sub(1, Ordering::AcqRel);
                    let mut c = c;
                    let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = reply(
                        &mut c,
                        false,
                        "503 Service Unavailable",
                        &[("Retry-After", "1")],
                        "text/plain",
                        "busy\n",
                    );
                    continue;
                }
                let ctx2 = ctx.clone();
                let spawned = std::thread::Builder::new()
                    .name("ferry-status-conn".into())
                    .spawn(move || {
                        // Counted out however the answer ends (a panic too).
                        struct Out<'a>(&'a AtomicUsize);
                        impl Drop for Out<'_> {
                            fn drop(&mut self) {
                                self.0.fetch_sub(1, Ordering::AcqRel);
                            }
                        }
                        let _out = Out(&ctx2.live);
                        let _ = answer(c, &ctx2);
                    });
                if spawned.is_err() {
                    ctx.live.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
    Ok(bound)
}

struct Ctx {
    bound: SocketAddr,
    token: Option<String>,
    status: Arc<Status>,
    /// This host's names (`uname -n`, without and with its domain).
    names: Vec<String>,
    live: AtomicUsize,
}

fn host_names() -> Vec<String> {
    let u = rustix::system::uname();
    let n = u.nodename().to_string_lossy().to_ascii_lowercase();
    let mut v = vec!["localhost".to_string()];
    if !n.is_empty() {
        if let Some((short, _)) = n.split_once('.') {
            v.push(short.to_string());
        }
        v.push(n);
    }
    v
}

/// Whether `host` (a `Host` header's value) names `ctx.bound`.
fn host_ok(host: &str, ctx: &Ctx) -> bool {
    let port = ctx.bound.port();
    let host = host.trim().to_ascii_lowercase();
    // `[v6]:port`, `v4:port`, `name:port`, or without the port (80).
    let (name, p) = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, "")) => (ip.to_string(), None),
            Some((ip, p)) => match p.strip_prefix(':') {
                Some(p) => (ip.to_string(), Some(p)),
                None => return false,
            },
            None => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n.to_string(), Some(p)),
            None => (host.clone(), None),
        }
    };
    let p = match p {
        Some(p) => match p.parse::<u16>() {
            Ok(p) => p,
            Err(_) => return false,
        },
        None => 80,
    };
    if p != port {
        return false;
    }
    let name = name.strip_suffix('.').unwrap_or(&name);
    match name.parse::<IpAddr>() {
        // An address: the one bound, or any when bound to all of them
        // (no page of another site is ever reached by an address alone).
        Ok(ip) => {
            ctx.bound.ip().is_unspecified()
                || ip == ctx.bound.ip()
                || (ip.is_loopback() && ctx.bound.ip().is_loopback())
        }
        Err(_) => ctx.names.iter().any(|n| n == name),
    }
}

/// Equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Read a request's head within the deadline: its length in `buf`, or
/// the status to answer.
fn read_head(c: &mut TcpStream, buf: &mut Vec<u8>) -> Result<usize, &'static str> {
    let end = Instant::now() + HEAD_DEADLINE;
    let mut chunk = [0u8; 4096];
    loop {
        {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(buf) {
                Ok(httparse::Status::Complete(n)) => return Ok(n),
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => {
                    return Err("431 Request Header Fields Too Large")
                }
                Err(_) => return Err("400 Bad Request"),
            }
        }
        if buf.len() >= MAX_HEAD {
            return Err("431 Request Header Fields Too Large");
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("408 Request Timeout");
        }
        let _ = c.set_read_timeout(Some(left));
        match c.read(&mut chunk) {
            Ok(0) => return Err(""),
            Ok(n) => buf.extend_from_slice(&chunk[..n.min(MAX_HEAD + 1 - buf.len().min(MAX_HEAD))]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err("408 Request Timeout")
            }
            Err(_) => return Err(""),
        }
    }
}

/// Whether a request carries the token (if one is set): `Authorization:
/// Bearer TOKEN` (the scheme in any case) or `?token=TOKEN`, compared in
/// constant time.
fn authorized(ctx: &Ctx, authorization: Option<String>, query: &str) -> bool {
    let Some(t) = &ctx.token else {
        return true;
    };
    let bearer = authorization.and_then(|v| {
        let v = v.trim();
        let (scheme, cred) = v.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| cred.trim().to_string())
    });
    let q = query.split('&').find_map(|kv| kv.strip_prefix("token="));
    bearer
        .as_deref()
        .is_some_and(|b| same(b.as_bytes(), t.as_bytes()))
        || q.is_some_and(|q| same(q.as_bytes(), t.as_bytes()))
}

fn answer(mut c: TcpStream, ctx: &Ctx) -> io::Result<()> {
    c.set_write_timeout(Some(HEAD_DEADLINE))?;
    let mut buf = Vec::with_capacity(1024);
    let n = match read_head(&mut c, &mut buf) {
        Ok(n) => n,
        Err("") => return Ok(()),
        Err(code) => return reply(&mut c, false, code, &[], "text/plain", "bad request\n"),
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let _ = req.parse(&buf[..n]);
    let method = req.method.unwrap_or("");
    let target = req.path.unwrap_or("");
    let head = method == "HEAD";
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
    };
    let hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .count();
    if hosts > 1 {
        return reply(
            &mut c,
            head,
            "400 Bad Request",
            &[],
            "text/plain",
            "one Host header\n",
        );
    }
    match header("host") {
        Some(h) if !host_ok(&h, ctx) => {
            return reply(
                &mut c,
                head,
                "421 Misdirected Request",
                &[],
                "text/plain",
                "this server does not answer for that Host\n",
            );
        }
        None if req.version == Some(1) => {
            return reply(
                &mut c,
                head,
                "400 Bad Request",
                &[],
                "text/plain",
                "Host required\n",
            );
        }
        _ => {}
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if !authorized(ctx, header("authorization"), query) {
        return reply(
            &mut c,
            head,
            "401 Unauthorized",
            &[("WWW-Authenticate", "Bearer realm=\"ferry\"")],
            "text/plain",
            "token required: Authorization: Bearer TOKEN, or ?token=TOKEN\n",
        );
    }
    if method != "GET" && !head {
        return reply(
            &mut c,
            false,
            "405 Method Not Allowed",
            &[("Allow", "GET, HEAD")],
            "text/plain",
            "GET or HEAD only\n",
        );
    }
    let s = &ctx.status;
    match path {
        "/" | "/index.html" => reply(
            &mut c,
            head,
            "200 OK",
            &[],
            "text/html; charset=utf-8",
            &s.page(),
        ),
        "/metrics" => reply(
            &mut c,
            head,
            "200 OK",
            &[],
            "text/plain; version=0.0.4; charset=utf-8",
            &s.metrics(),
        ),
        "/status.json" => reply(&mut c, head, "200 OK", &[], "application/json", &s.json()),
        _ => reply(
            &mut c,
            head,
            "404 Not Found",
            &[],
            "text/plain",
            "not found\n",
        ),
    }
}

fn reply(
    c: &mut TcpStream,
    head: bool,
    code: &str,
    extra: &[(&str, &str)],
    ctype: &str,
    body: &str,
) -> io::Result<()> {
    let mut h = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; img-src 'self'\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    c.write_all(h.as_bytes())?;
    if !head {
        c.write_all(body.as_bytes())?;
    }
    c.flush()?;
    // Let the client read the answer before the close (a close with
    // unread request bytes would reset the connection).
    let _ = c.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(bound: &str) -> Ctx {
        Ctx {
            bound: bound.parse().unwrap(),
            token: None,
            status: Arc::new(Status::new("t")),
            names: vec!["localhost".into(), "box".into()],
            live: AtomicUsize::new(0),
        }
    }

    #[test]
    fn the_host_must_name_the_bound_address() {
        let c = ctx("127.0.0.1:7878");
        for ok in [
            "127.0.0.1:7878",
            "localhost:7878",
            "LOCALHOST:7878",
            "box:7878",
            "localhost.:7878",
        ] {
            assert!(host_ok(ok, &c), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:7878",
            "127.0.0.1:80",
            "localhost",
            "10.0.0.1:7878",
            "127.0.0.1:x",
            "[::1]:80",
        ] {
            assert!(!host_ok(bad, &c), "{bad}");
        }
        let c6 = ctx("[::1]:9000");
        assert!(host_ok("[::1]:9000", &c6) && host_ok("localhost:9000", &c6));
        assert!(!host_ok("[::1]", &c6) && !host_ok("evil:9000", &c6));
        let any = ctx("0.0.0.0:7878");
        assert!(host_ok("192.0.2.7:7878", &any) && !host_ok("evil.example:7878", &any));
    }
}
