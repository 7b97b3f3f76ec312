//! The direct ranged-GET path against a scripted S3 endpoint in the test
//! process: exact bytes, kept-alive connections, a connection dropped
//! mid-body resumed, answers it does not handle sent again through ureq,
//! `If-Match` still enforced, `--bwlimit` still asked for every byte.
//! (Against Garage, every ranged download of the S3 tests takes this path.)

use parking_lot::Mutex;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::io;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::piece::DIRECT_ALIGN;
use ferry_engine::store::{RangedSource, Store, RANGE_PIECE};
use rusty_s3::Credentials;

use super::*;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    /// The first GET sends this many body bytes, then closes.
    DropFirstAfter(usize),
    /// Bodies in chunked transfer coding.
    Chunked,
    /// Bodies sent in bursts of uneven sizes with pauses between them.
    Trickle,
}

struct Fake {
    data: Vec<u8>,
    etag: String,
    mode: Mode,
    /// (connection number, Range header) of every GET.
    gets: Mutex<Vec<(usize, String)>>,
    /// Method and path of every POST and DELETE (POSTs answered 501).
    writes: Mutex<Vec<String>>,
    conns: AtomicUsize,
}

fn start(len: usize, mode: Mode) -> (S3Store, Arc<Fake>) {
    let mut x = 0x2545_f491_u32;
    let data = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let fake = Arc::new(Fake {
        data,
        etag: "\"0123456789abcdef\"".into(),
        mode,
        gets: Mutex::new(Vec::new()),
        writes: Mutex::new(Vec::new()),
        conns: AtomicUsize::new(0),
    });
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", l.local_addr().unwrap());
    let f = fake.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { continue };
            let n = f.conns.fetch_add(1, Ordering::SeqCst);
            let f = f.clone();
            std::thread::spawn(move || serve(c, n, &f));
        }
    });
    let cfg = S3Config {
        endpoint: url::Url::parse(&endpoint).unwrap(),
        region: "garage".into(),
        bucket: "b".into(),
        prefix: String::new(),
        credentials: Some(Credentials::new("GKtest", "secret")),
        path_style: true,
    };
    (S3Store::new(&cfg, 4).unwrap(), fake)
}

fn serve(c: TcpStream, conn: usize, f: &Fake) {
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut w = c;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut words = line.split(' ');
        let method = words.next().unwrap_or("").to_string();
        let path = words
            .next()
            .unwrap_or("")
            .split('?')
            .next()
            .unwrap_or("")
            .to_string();
        let (mut range, mut if_match, mut body_len) = (None, None, 0);
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            let v = v.trim().to_string();
            if k.eq_ignore_ascii_case("range") {
                range = Some(v);
            } else if k.eq_ignore_ascii_case("if-match") {
                if_match = Some(v);
            } else if k.eq_ignore_ascii_case("content-length") {
                body_len = v.parse().unwrap();
            }
        }
        if method == "POST" || method == "DELETE" {
            let mut body = vec![0u8; body_len];
            std::io::Read::read_exact(&mut r, &mut body).unwrap();
            f.writes.lock().push(format!("{method} {path}"));
            let _ = if method == "POST" {
                let err = "<Error><Code>NotImplemented</Code><Message>no</Message></Error>";
                write!(
                    w,
                    "HTTP/1.1 501 Not Implemented\r\ncontent-length: {}\r\n\r\n{err}",
                    err.len()
                )
            } else {
                write!(w, "HTTP/1.1 204 No Content\r\n\r\n")
            };
            continue;
        }
        let len = f.data.len();
        if method == "HEAD" {
            let _ = write!(
                w,
                "HTTP/1.1 200 OK\r\ncontent-length: {len}\r\netag: {}\r\n\r\n",
                f.etag
            );
            continue;
        }
        let range = range.unwrap();
        let first = {
            let mut g = f.gets.lock();
            g.push((conn, range.clone()));
            g.len() == 1
        };
        if if_match.as_deref().is_some_and(|m| m != f.etag) {
            let body = "<Error><Code>PreconditionFailed</Code><Message>etag</Message></Error>";
            let _ = write!(
                w,
                "HTTP/1.1 412 Precondition Failed\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            continue;
        }
        let (a, b) = range
            .strip_prefix("bytes=")
            .unwrap()
            .split_once('-')
            .unwrap();
        let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
        let body = &f.data[a..=b];
        let head = format!(
            "HTTP/1.1 206 Partial Content\r\ncontent-range: bytes {a}-{b}/{len}\r\netag: {}\r\n",
            f.etag
        );
        match f.mode {
            Mode::Chunked => {
                let _ = write!(w, "{head}transfer-encoding: chunked\r\n\r\n");
                for piece in body.chunks(100_000) {
                    let _ = write!(w, "{:x}\r\n", piece.len());
                    let _ = w.write_all(piece);
                    let _ = w.write_all(b"\r\n");
                }
                let _ = w.write_all(b"0\r\n\r\n");
            }
            Mode::Trickle => {
                let _ = write!(w, "{head}content-length: {}\r\n\r\n", body.len());
                let mut x = 0x9e37_79b9_u32 ^ a as u32;
                let mut at = 0;
                while at < body.len() {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let n = (1 + x as usize % (600 << 10)).min(body.len() - at);
                    let _ = w.write_all(&body[at..at + n]);
                    at += n;
                    std::thread::sleep(std::time::Duration::from_millis(15));
                }
            }
            Mode::DropFirstAfter(k) if first => {
                let _ = write!(w, "{head}content-length: {}\r\n\r\n", body.len());
                let _ = w.write_all(&body[..k]);
                let _ = w.shutdown(std::net::Shutdown::Both);
                return;
            }
            _ => {
                let _ = write!(w, "{head}content-length: {}\r\n\r\n", body.len());
                let _ = w.write_all(body);
            }
        }
    }
}

/// Read `[off, off + len)` of the object: the bytes, and the pieces' sizes.
fn read(
    st: &S3Store,
    off: u64,
    len: u64,
    limit: Option<&Limiter>,
) -> io::Result<(Vec<u8>, Vec<usize>)> {
    let r = st.open_file(
        &S3Dir {
            prefix: String::new(),
        },
        c"obj",
    )?;
    let (mut got, mut pieces) = (Vec::new(), Vec::new());
    r.read_range(
        off,
        len,
        &mut |at, d| {
            assert_eq!(at, off + got.len() as u64, "pieces in order");
            got.extend_from_slice(d);
            pieces.push(d.len());
            Ok(())
        },
        limit,
    )?;
    Ok((got, pieces))
}

#[test]
fn ranges_arrive_exactly_over_one_kept_alive_connection() {
    let len = (3 << 20) + 12_345;
    let (st, f) = start(len, Mode::Plain);
    let (a, pieces) = read(&st, 0, 2 << 20, None).unwrap();
    let (b, _) = read(&st, 2 << 20, len as u64 - (2 << 20), None).unwrap();
    assert_eq!([a, b].concat(), f.data);
    assert_eq!(pieces, [RANGE_PIECE, RANGE_PIECE]);
    let c = st.counters();
    assert_eq!(c.direct_gets.load(Ordering::SeqCst), 2);
    assert_eq!(c.direct_fallbacks.load(Ordering::SeqCst), 0);
    let gets = f.gets.lock().clone();
    assert_eq!(gets.len(), 2);
    // Same connection for both GETs (HEAD and GETs share it).
    assert_eq!(gets[0].0, gets[1].0, "{gets:?}");
    assert_eq!(gets[1].1, format!("bytes={}-{}", 2 << 20, len - 1));
}

#[test]
fn bodies_in_bursts_never_leave_a_read_waiting_for_bytes_that_never_come() {
    // Reads wake up only once SO_RCVLOWAT bytes are in: a mark above what
    // the body still has to send would stall the read until the 120 s I/O
    // timeout. Ranges of many lengths, their bodies in uneven bursts.
    let len = (5 << 20) + 4321;
    let (st, f) = start(len, Mode::Trickle);
    let t = std::time::Instant::now();
    let mut off = 0u64;
    for n in [1u64, 5000, 70_000, 300_000, (1 << 20) + 1, (2 << 20) + 333] {
        let (got, _) = read(&st, off, n, None).unwrap();
        assert_eq!(got, f.data[off as usize..(off + n) as usize]);
        off += n;
    }
    let (got, _) = read(&st, off, len as u64 - off, None).unwrap();
    assert_eq!(got, f.data[off as usize..]);
    assert_eq!(st.counters().direct_fallbacks.load(Ordering::SeqCst), 0);
    // Seconds at most here; a stalled read alone would take 120.
    assert!(
        t.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn a_connection_dropped_mid_body_resumes_where_it_broke() {
    let len = 3 << 20;
    let cut = (1 << 20) + 777;
    let (st, f) = start(len, Mode::DropFirstAfter(cut));
    let (got, pieces) = read(&st, 0, len as u64, None).unwrap();
    assert_eq!(got, f.data);
    let gets = f.gets.lock().clone();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[1].1, format!("bytes={cut}-{}", len - 1));
    // After the break, pieces end on block boundaries again.
    let mut at = 0;
    for p in &pieces {
        at += p;
        assert!(
            at.is_multiple_of(DIRECT_ALIGN) || at == cut || at == len,
            "{pieces:?}"
        );
    }
    assert_eq!(st.counters().direct_gets.load(Ordering::SeqCst), 2);
}

#[test]
fn answers_it_does_not_handle_go_through_the_http_client() {
    let len = 2 << 20;
    let (st, f) = start(len, Mode::Chunked);
    let (got, _) = read(&st, 0, len as u64, None).unwrap();
    assert_eq!(got, f.data);
    let (got, _) = read(&st, 100, 1000, None).unwrap();
    assert_eq!(got, f.data[100..1100]);
    let c = st.counters();
    assert_eq!(c.direct_gets.load(Ordering::SeqCst), 0);
    // Once: then the direct path is off for this server.
    assert_eq!(c.direct_fallbacks.load(Ordering::SeqCst), 1);
}

#[test]
fn a_changed_object_fails_instead_of_mixing_versions() {
    let (st, _f) = start(1 << 20, Mode::Plain);
    let r = st
        .open_file(
            &S3Dir {
                prefix: String::new(),
            },
            c"obj",
        )
        .unwrap();
    // As if the object had changed since its identity was taken.
    r.ident.set((1 << 20, "\"other\"".into())).unwrap();
    let err = r
        .read_range(0, 1 << 20, &mut |_, _| Ok(()), None)
        .unwrap_err();
    assert!(err.to_string().contains("412"), "{err}");
}

#[test]
fn every_byte_is_paced_by_the_limit() {
    let len = (2 << 20) + 5;
    let (st, f) = start(len, Mode::Plain);
    // Under a second; its chunk (150,000 bytes) is not a block multiple.
    let l = Limiter::new(3_000_000);
    let (got, pieces) = read(&st, 0, len as u64, Some(&l)).unwrap();
    assert_eq!(got, f.data);
    assert_eq!(l.granted(), len as u64);
    assert!(pieces.iter().all(|&p| p <= l.chunk()), "{pieces:?}");
    assert!(pieces.len() >= len / l.chunk());
}

#[test]
fn a_server_without_batch_delete_gets_one_delete_per_key() {
    let (st, f) = start(10, Mode::Plain);
    let keys: Vec<String> = (0..20).map(|i| format!("d/k{i}")).collect();
    st.delete_keys(&keys).unwrap();
    st.delete_keys(&keys[..5]).unwrap();
    let mut w = f.writes.lock().clone();
    // One DeleteObjects tried, refused, and not tried again.
    assert_eq!(
        w.iter().filter(|x| x.starts_with("POST")).count(),
        1,
        "{w:?}"
    );
    w.retain(|x| x.starts_with("DELETE"));
    w.sort();
    let mut want: Vec<String> = keys
        .iter()
        .chain(&keys[..5])
        .map(|k| format!("DELETE /b/{k}"))
        .collect();
    want.sort();
    assert_eq!(w, want);
}
