//! S3 faults, against a scripted S3 endpoint in the test process: transient
//! errors (503 SlowDown, 500, dropped connections) are retried with backoff
//! until they pass; when retries run out the run goes on with the other
//! objects, lists each failed key on stderr and exits 1.

mod util;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use util::*;

/// How the fake server answers PUTs of a key: fail the first `fails`
/// attempts (`None`: always) in the way `how` says.
#[derive(Clone, Copy)]
enum How {
    SlowDown,
    Internal,
    Drop,
}

#[derive(Default)]
struct Server {
    /// key → attempts seen.
    puts: Mutex<HashMap<String, u32>>,
    /// Keys stored (bodies).
    stored: Mutex<HashMap<String, Vec<u8>>>,
}

type Script = Arc<dyn Fn(&str) -> (Option<u32>, How) + Send + Sync>;

fn start(script: Script) -> (String, Arc<Server>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", l.local_addr().unwrap());
    let server = Arc::new(Server::default());
    let s = server.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { continue };
            let (s, script) = (s.clone(), script.clone());
            std::thread::spawn(move || serve(conn, &s, &*script));
        }
    });
    (addr, server)
}

fn serve(conn: TcpStream, s: &Server, script: &(dyn Fn(&str) -> (Option<u32>, How) + Sync)) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let path = target.split('?').next().unwrap_or("").to_string();
        // Path style: /bucket or /bucket/key.
        let key = path
            .trim_start_matches('/')
            .split_once('/')
            .map(|(_, k)| k.to_string())
            .filter(|k| !k.is_empty());
        let reply = |w: &mut TcpStream, status: &str, body: &str| {
            let _ = write!(
                w,
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\netag: \"0123456789abcdef0123456789abcdef\"\r\n\r\n{body}",
                body.len()
            );
        };
        match (method.as_str(), key) {
            ("HEAD", None) => reply(&mut w, "200 OK", ""),
            ("GET", None) => reply(
                &mut w,
                "200 OK",
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><IsTruncated>false</IsTruncated></ListBucketResult>",
            ),
            ("PUT", Some(k)) => {
                let n = {
                    let mut p = s.puts.lock().unwrap();
                    let c = p.entry(k.clone()).or_insert(0);
                    *c += 1;
                    *c
                };
                let (fails, how) = script(&k);
                if fails.is_none_or(|f| n <= f) {
                    match how {
                        How::SlowDown => reply(&mut w, "503 Slow Down", "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"),
                        How::Internal => reply(&mut w, "500 Internal Server Error", "<Error><Code>InternalError</Code><Message>oops</Message></Error>"),
                        How::Drop => return,
                    }
                } else {
                    s.stored.lock().unwrap().insert(k, body);
                    reply(&mut w, "200 OK", "");
                }
            }
            _ => reply(&mut w, "400 Bad Request", "<Error><Code>NotImplemented</Code></Error>"),
        }
    }
}

fn env_run(endpoint: &str, args: &[&str]) -> Run {
    std::env::set_var("AWS_ACCESS_KEY_ID", "GKtest");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "secret");
    std::env::set_var("AWS_REGION", "garage");
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    v.push("--s3-endpoint".into());
    v.push(endpoint.into());
    ferry(&v)
}

#[test]
fn transient_errors_are_retried_until_they_pass() {
    let (ep, server) = start(Arc::new(|k: &str| match k {
        "p/slow.txt" => (Some(3), How::SlowDown),
        "p/err.txt" => (Some(2), How::Internal),
        "p/drop.txt" => (Some(2), How::Drop),
        _ => (Some(0), How::SlowDown),
    }));
    let t = tmpdir();
    let src = t.path().join("src");
    for f in ["slow.txt", "err.txt", "drop.txt", "fine.txt"] {
        write(&src, f, f.as_bytes());
    }
    let r = env_run(&ep, &["copy", "--json", src.to_str().unwrap(), "s3://b/p"]);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(summary(&r).files_copied, 4, "{r}");
    let puts = server.puts.lock().unwrap();
    assert_eq!(puts["p/slow.txt"], 4);
    assert_eq!(puts["p/err.txt"], 3);
    assert_eq!(puts["p/drop.txt"], 3);
    assert_eq!(puts["p/fine.txt"], 1);
    let stored = server.stored.lock().unwrap();
    assert_eq!(stored["p/slow.txt"], b"slow.txt");
    assert_eq!(stored["p/drop.txt"], b"drop.txt");
}

#[test]
fn when_retries_run_out_the_failed_keys_are_listed_and_the_rest_is_done() {
    let (ep, server) = start(Arc::new(|k: &str| match k {
        "p/bad1.txt" | "p/d/bad2.txt" => (None, How::SlowDown),
        _ => (Some(0), How::SlowDown),
    }));
    let t = tmpdir();
    let src = t.path().join("src");
    for f in ["bad1.txt", "d/bad2.txt", "ok1.txt", "d/ok2.txt"] {
        write(&src, f, f.as_bytes());
    }
    let r = env_run(&ep, &["copy", src.to_str().unwrap(), "s3://b/p"]);
    assert_eq!(r.code, Some(1), "{r}");
    let err = String::from_utf8_lossy(&r.stderr);
    for f in ["bad1.txt", "d/bad2.txt"] {
        let line = err
            .lines()
            .find(|l| l.starts_with(&format!("ferry: {f}: ")))
            .unwrap_or_else(|| panic!("no error line for {f}: {r}"));
        assert!(line.contains("SlowDown"), "{line}");
    }
    let puts = server.puts.lock().unwrap();
    assert_eq!(puts["p/bad1.txt"], 6, "6 attempts, then given up");
    let stored = server.stored.lock().unwrap();
    assert!(stored.contains_key("p/ok1.txt") && stored.contains_key("p/d/ok2.txt"));
    assert!(!stored.contains_key("p/bad1.txt"));
}
