//! A fault-injecting HTTP/1.1 proxy in front of a real S3 server (Garage, moto): every
//! request goes to the server and its answer back as they are, except where the test's rule
//! says otherwise for one exchange: answer in the server's stead (an empty `200`), rewrite the
//! server's answer (a page cut short, a token dropped, keys changed), or freeze (stop reading
//! and answering on every connection from then on, as a `SIGSTOP`ped server does: the kernel
//! still accepts connections and buffers what is sent until its buffers are full).
//!
//! Requests are forwarded one at a time per client connection, each on a new connection to
//! the server (`Connection: close`), so answers are whole before the rule sees them; the
//! answer goes back with a `Content-Length` (a chunked one is decoded first). The `Host`
//! header is kept, so the client's signature stays valid.

use parking_lot::Mutex;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One request as the rule sees it, before its body is read.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: String,
    /// The request target: path and query (`/bucket?list-type=2&prefix=...`).
    pub target: String,
    /// For a ListObjectsV2: its number among the listings with the `/` delimiter this proxy
    /// forwarded (1 for the first); 0 for every other request (a listing without the
    /// delimiter included).
    pub dir_list: u64,
}

impl Exchange {
    /// A ListObjectsV2 request.
    pub fn is_list(&self) -> bool {
        self.method == "GET" && self.target.contains("list-type=2")
    }

    /// The value of query parameter `name` (still percent-encoded).
    pub fn query(&self, name: &str) -> Option<&str> {
        let q = self.target.split_once('?')?.1;
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then_some(v)
        })
    }
}

/// What the proxy does with one exchange.
pub enum Fault {
    /// Forward it, and its answer, as they are.
    Pass,
    /// Answer with this status and body; the server never sees the request.
    Answer(u16, String),
    /// Forward it, and give back the server's answer with its body rewritten.
    Rewrite(Box<dyn FnOnce(String) -> String + Send>),
    /// Stop: this connection, and every one from now on, is neither read nor answered.
    Freeze,
}

type Rule = Box<dyn Fn(&Exchange) -> Fault + Send + Sync>;

struct State {
    upstream: String,
    rule: Rule,
    frozen: AtomicBool,
    stop: AtomicBool,
    dir_lists: AtomicU64,
    /// Exchanges the rule did not pass as they were.
    faults: AtomicU64,
    /// Every connection's socket (to close them when the proxy goes).
    socks: Mutex<Vec<TcpStream>>,
}

/// The proxy; it stops (closing every connection) when dropped.
pub struct Proxy {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    state: Arc<State>,
}

impl Proxy {
    /// A proxy to `upstream` (`http://host:port`) applying `rule` to every request.
    pub fn start(
        upstream: &str,
        rule: impl Fn(&Exchange) -> Fault + Send + Sync + 'static,
    ) -> Proxy {
        let up = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        l.set_nonblocking(true).unwrap();
        let state = Arc::new(State {
            upstream: up,
            rule: Box::new(rule),
            frozen: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            dir_lists: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            socks: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        std::thread::spawn(move || loop {
            if st.stop.load(Ordering::Relaxed) {
                return;
            }
            match l.accept() {
                Ok((c, _)) => {
                    c.set_nonblocking(false).unwrap();
                    if let Ok(k) = c.try_clone() {
                        st.socks.lock().push(k);
                    }
                    let st = st.clone();
                    std::thread::spawn(move || serve(c, &st));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        });
        Proxy { endpoint, state }
    }

    /// How many exchanges the rule changed (answered, rewrote or froze).
    pub fn faults(&self) -> u64 {
        self.state.faults.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        for s in self.state.socks.lock().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Hold a connection open, unread, until the proxy stops.
fn hold(st: &State) {
    while !st.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A request or answer head: its first line and headers (names as sent).
struct Head {
    line: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn read_head(r: &mut impl BufRead) -> io::Result<Option<Head>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok(Some(Head {
        line: line.trim_end_matches(['\r', '\n']).to_string(),
        headers,
    }))
}

/// A body: chunked, by its length, or (`to_eof`) up to the end of the connection.
fn read_body(r: &mut impl BufRead, h: &Head, to_eof: bool) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    if h.get("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| io::Error::other("bad chunk size"))?;
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                // (No trailers from the servers tested.)
                return Ok(body);
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    match h
        .get("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(n) => {
            body.resize(n, 0);
            r.read_exact(&mut body)?;
        }
        None if to_eof => {
            r.read_to_end(&mut body)?;
        }
        None => {}
    }
    Ok(body)
}

fn serve(c: TcpStream, st: &State) {
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut w = c;
    loop {
        if st.frozen.load(Ordering::Relaxed) {
            return hold(st);
        }
        let Ok(Some(req)) = read_head(&mut r) else {
            return;
        };
        let mut parts = req.line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let mut ex = Exchange {
            method,
            target,
            dir_list: 0,
        };
        if ex.is_list() && ex.query("delimiter").is_some() {
            ex.dir_list = st.dir_lists.fetch_add(1, Ordering::Relaxed) + 1;
        }
        let fault = (st.rule)(&ex);
        if !matches!(fault, Fault::Pass) {
            st.faults.fetch_add(1, Ordering::Relaxed);
        }
        if let Fault::Freeze = fault {
            st.frozen.store(true, Ordering::Relaxed);
            return hold(st);
        }
        let Ok(body) = read_body(&mut r, &req, false) else {
            return;
        };
        let (head, mut answer) = match fault {
            Fault::Answer(status, b) => (format!("HTTP/1.1 {status} Faulty\r\n"), b.into_bytes()),
            f => {
                let Ok((ah, ab)) = forward(st, &req, &body, ex.method == "HEAD") else {
                    return;
                };
                let mut head = format!("{}\r\n", ah.line);
                for (k, v) in &ah.headers {
                    let drop = ["transfer-encoding", "connection", "content-length"]
                        .iter()
                        .any(|d| k.eq_ignore_ascii_case(d));
                    if !drop {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                }
                if ex.method == "HEAD" {
                    if let Some(n) = ah.get("content-length") {
                        head.push_str(&format!("content-length: {n}\r\n"));
                    }
                }
                let ab = match f {
                    Fault::Rewrite(how) => {
                        how(String::from_utf8_lossy(&ab).into_owned()).into_bytes()
                    }
                    _ => ab,
                };
                (head, ab)
            }
        };
        let mut out = head.into_bytes();
        if ex.method == "HEAD" {
            answer.clear();
            if !String::from_utf8_lossy(&out)
                .to_ascii_lowercase()
                .contains("content-length")
            {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
        } else {
            out.extend_from_slice(format!("content-length: {}\r\n", answer.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&answer);
        if w.write_all(&out).is_err() {
            return;
        }
    }
}

/// Send `req` with `body` to the server on a connection of its own; its answer.
fn forward(st: &State, req: &Head, body: &[u8], head_only: bool) -> io::Result<(Head, Vec<u8>)> {
    let mut s = TcpStream::connect(&st.upstream)?;
    let mut out = format!("{}\r\n", req.line);
    for (k, v) in &req.headers {
        if !k.eq_ignore_ascii_case("connection") && !k.eq_ignore_ascii_case("transfer-encoding") {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    if req.get("content-length").is_none() && !body.is_empty() {
        out.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    out.push_str("connection: close\r\n\r\n");
    s.write_all(out.as_bytes())?;
    s.write_all(body)?;
    let mut r = BufReader::new(s);
    loop {
        let h = read_head(&mut r)?.ok_or(io::ErrorKind::UnexpectedEof)?;
        // An interim `100 Continue`: the real answer follows.
        if h.line.split_whitespace().nth(1) == Some("100") {
            continue;
        }
        let status = h.line.split_whitespace().nth(1).unwrap_or("");
        let b = if head_only || status == "204" || status == "304" {
            Vec::new()
        } else {
            read_body(&mut r, &h, true)?
        };
        return Ok((h, b));
    }
}
