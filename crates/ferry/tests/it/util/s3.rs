//! Shared helpers of the tests against real S3 servers: Garage and moto's server, started by
//! `scripts/test` through `scripts/garage` and `scripts/moto`. A test written with
//! [`each_server`] runs once per server configured.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::*;

/// Where a test's S3 server is.
#[derive(Clone)]
pub struct S3 {
    /// Which server: "garage", "moto", ...
    pub name: String,
    pub endpoint: String,
    pub bucket: String,
    pub key: String,
    pub secret: String,
    pub region: String,
    /// Keys per listing page asked of the server (`FERRY_TEST_S3_PAGE`),
    /// when not its own 1,000.
    pub page: Option<u32>,
}

/// The server described by the variables `{var}_ENDPOINT`, `_BUCKET`, `_KEY`, `_SECRET` and
/// `_REGION` (e.g. `FERRY_TEST_S3`). None when `FERRY_SKIP_S3` is set: the S3 tests are then
/// skipped on purpose; without it a missing variable fails the test.
///
/// The ferry processes the test starts inherit the credentials, region and endpoint: this
/// sets `AWS_*` in the test process (same values from every thread of one test binary, so a
/// test binary talks to one server only).
pub fn s3_from(var: &str) -> Option<S3> {
    if std::env::var_os("FERRY_SKIP_S3").is_some() {
        return None;
    }
    // The one skip policy (`super::skip`): said here, a failure under CI.
    if std::env::var_os(format!("{var}_ENDPOINT")).is_none() {
        super::skip(&format!(
            "{var}_ENDPOINT is not set: run the tests with scripts/test (it starts Garage and moto)"
        ));
        return None;
    }
    let get = |k: &str| {
        let k = format!("{var}_{k}");
        std::env::var(&k).unwrap_or_else(|_| {
            panic!(
                "{k} is not set: run the tests with scripts/test (it starts Garage), \
                 or set FERRY_SKIP_S3=1"
            )
        })
    };
    let s = S3 {
        name: var.to_string(),
        endpoint: get("ENDPOINT"),
        bucket: get("BUCKET"),
        key: get("KEY"),
        secret: get("SECRET"),
        region: get("REGION"),
        page: None,
    };
    std::env::set_var("AWS_ACCESS_KEY_ID", &s.key);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", &s.secret);
    std::env::set_var("AWS_REGION", &s.region);
    std::env::set_var("AWS_ENDPOINT_URL", &s.endpoint);
    Some(s)
}

/// The single-node Garage of `scripts/test`.
pub fn s3() -> Option<S3> {
    s3_from("FERRY_TEST_S3")
}

/// Every server the S3 tests run against: the single-node Garage (`FERRY_TEST_S3_*`) and
/// moto's server (`FERRY_TEST_S3M_*`), each skipped when its endpoint is not set (a
/// failure under CI: [`super::skip`]). None with `FERRY_SKIP_S3`. Unlike
/// [`s3_from`] this sets nothing in the test process: run ferry with [`S3::run`],
/// [`S3::ferry`] or [`S3::spawn`], which pass the server's settings to it.
pub fn servers() -> Vec<S3> {
    if std::env::var_os("FERRY_SKIP_S3").is_some() {
        return Vec::new();
    }
    let mut v = Vec::new();
    for (var, name) in [("FERRY_TEST_S3", "garage"), ("FERRY_TEST_S3M", "moto")] {
        // The one skip policy (`super::skip`): said, a failure under CI.
        if std::env::var_os(format!("{var}_ENDPOINT")).is_none() {
            super::skip(&format!(
                "{var}_ENDPOINT is not set: not run against {name} (scripts/test starts it)"
            ));
            continue;
        }
        let get = |k: &str| {
            let k = format!("{var}_{k}");
            std::env::var(&k).unwrap_or_else(|_| {
                panic!(
                    "{k} is not set: run the tests with scripts/test (it starts the S3 \
                     servers), or set FERRY_SKIP_S3=1"
                )
            })
        };
        v.push(S3 {
            name: name.to_string(),
            endpoint: get("ENDPOINT"),
            bucket: get("BUCKET"),
            key: get("KEY"),
            secret: get("SECRET"),
            region: get("REGION"),
            page: None,
        });
    }
    v
}

/// Run `test` once against each server of [`servers`] (the server's name goes to stderr
/// first, so a failure says which one).
pub fn each_server(test: impl Fn(&S3)) {
    for s in servers() {
        eprintln!("--- S3 server: {} ({})", s.name, s.endpoint);
        test(&s);
    }
}

impl S3 {
    /// `ferry` with this server's endpoint, credentials and region in its environment.
    pub fn command(&self) -> Command {
        let mut c = Command::new(bin());
        c.env("AWS_ACCESS_KEY_ID", &self.key)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret)
            .env("AWS_REGION", &self.region)
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env_remove("AWS_ENDPOINT_URL_S3")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .stdin(Stdio::null());
        match self.page {
            Some(n) => c.env("FERRY_TEST_S3_PAGE", n.to_string()),
            None => c.env_remove("FERRY_TEST_S3_PAGE"),
        };
        c
    }

    /// This server with listing pages of `n` keys: a few hundred objects
    /// make several pages.
    pub fn paged(&self, n: u32) -> S3 {
        S3 {
            page: Some(n),
            ..self.clone()
        }
    }

    /// `ferry ARGS...` against this server (mixed argument types).
    pub fn run(&self, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
        let v: Vec<OsString> = args.iter().map(|a| a.as_ref().to_owned()).collect();
        self.ferry(&v)
    }

    /// `ferry ARGS...` against this server.
    pub fn ferry<I, A>(&self, args: I) -> Run
    where
        I: IntoIterator<Item = A>,
        A: AsRef<std::ffi::OsStr>,
    {
        let mut c = self.command();
        c.args(args);
        run_within(c, Duration::from_secs(600))
    }

    /// Start `ferry ARGS...` against this server without capturing its output.
    pub fn spawn<I, A>(&self, args: I) -> Child
    where
        I: IntoIterator<Item = A>,
        A: AsRef<std::ffi::OsStr>,
    {
        self.command()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ferry")
    }

    /// `s3://bucket/NAME-TIME-N`: a prefix no other test (or earlier run) uses.
    pub fn url(&self, name: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("s3://{}/{name}-{t}-{n}", self.bucket)
    }
}

/// `ferry ARGS...` with mixed argument types (paths, strings).
pub fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let v: Vec<OsString> = args.iter().map(|a| a.as_ref().to_owned()).collect();
    ferry(&v)
}

/// (relative path, bytes, mtime, permission bits) of every regular file under `root`, sorted.
pub type FileList = Vec<(PathBuf, Vec<u8>, Mtime, u32)>;

pub fn file_list(root: &Path) -> FileList {
    let mut v: FileList = walk(root)
        .into_iter()
        .filter(|p| {
            std::fs::symlink_metadata(root.join(p))
                .unwrap()
                .file_type()
                .is_file()
        })
        .map(|p| {
            let full = root.join(&p);
            let m = std::fs::metadata(&full).unwrap();
            (
                p.clone(),
                std::fs::read(&full).unwrap(),
                get_mtime(&full),
                m.permissions().mode() & 0o7777,
            )
        })
        .collect();
    v.sort_by(|x, y| x.0.cmp(&y.0));
    v
}

/// The regular files under `a` and `b` are the same: names, bytes, mtimes (ns) and modes.
/// (What an object store keeps of a tree: no directory metadata, empty directories or
/// symlinks.)
#[track_caller]
pub fn assert_files_equal(a: &Path, b: &Path) {
    let (fa, fb) = (file_list(a), file_list(b));
    let names = |f: &FileList| f.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&fa),
        names(&fb),
        "different files in {} and {}",
        a.display(),
        b.display()
    );
    for (x, y) in fa.iter().zip(&fb) {
        assert!(
            x.1 == y.1,
            "{:?}: content differs ({} vs {} bytes)",
            x.0,
            x.1.len(),
            y.1.len()
        );
        assert_eq!(x.2, y.2, "{:?}: mtime differs", x.0);
        assert_eq!(x.3, y.3, "{:?}: mode differs", x.0);
    }
}

/// A TCP proxy to `upstream` (`http://host:port`) that goes away for good once `cut_after`
/// bytes went up through it: every connection is shut and new ones are refused, as when the
/// server dies mid-upload. Returns its endpoint.
pub fn cutting_proxy(upstream: &str, cut_after: u64) -> String {
    use parking_lot::Mutex;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let up = upstream
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = format!("http://{}", l.local_addr().unwrap());
    l.set_nonblocking(true).unwrap();
    let cut = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let socks: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    std::thread::spawn(move || loop {
        if cut.load(Ordering::Relaxed) {
            for s in socks.lock().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
            return; // the listener goes with this thread
        }
        let Ok((c, _)) = l.accept() else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        c.set_nonblocking(false).unwrap();
        let Ok(s) = TcpStream::connect(&up) else {
            continue;
        };
        {
            let mut v = socks.lock();
            v.push(c.try_clone().unwrap());
            v.push(s.try_clone().unwrap());
        }
        for (mut from, mut to, count) in [
            (c.try_clone().unwrap(), s.try_clone().unwrap(), true),
            (s, c, false),
        ] {
            let (cut, sent) = (cut.clone(), sent.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if cut.load(Ordering::Relaxed) || to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if count && sent.fetch_add(n as u64, Ordering::Relaxed) + n as u64 > cut_after {
                        cut.store(true, Ordering::Relaxed);
                        break;
                    }
                }
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
            });
        }
    });
    ep
}

/// `s3://bucket/prefix` → (bucket, prefix).
pub fn split_url(url: &str) -> (&str, &str) {
    url.strip_prefix("s3://").unwrap().split_once('/').unwrap()
}

/// Another S3 client than ferry, for plain keys (letters, digits, `-_.`, segments that are
/// neither empty, `.` nor `..`): curl with its own SigV4 signing, as a user's script would
/// upload or fetch. `method` on `key`, with `body` and extra `headers`; the response's body.
/// A request takes ~10 ms where the AWS CLI's Python start takes 0.5 s of CPU (2-3 s under
/// the suite's load); keys a URL path cannot carry as they are go through [`aws`].
pub fn curl(s3: &S3, method: &str, key: &str, body: Option<&[u8]>, headers: &[String]) -> Vec<u8> {
    let plain = key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
        && key
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..");
    assert!(plain, "{key:?}: not a plain key (use aws)");
    let t = tmpdir();
    let mut c = Command::new("curl");
    c.args(["-sS", "--fail-with-body", "--path-as-is", "--aws-sigv4"])
        .arg(format!("aws:amz:{}:s3", s3.region))
        .arg("--user")
        .arg(format!("{}:{}", s3.key, s3.secret))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-X", method]);
    for h in headers {
        c.args(["-H", h]);
    }
    if let Some(b) = body {
        let f = write(t.path(), "body", b);
        c.args(["-H", "Content-Type: binary/octet-stream", "--data-binary"])
            .arg(format!("@{}", f.display()));
    }
    c.arg(format!("{}/{}/{key}", s3.endpoint, s3.bucket));
    let out = c.output().expect("curl is installed by scripts/test");
    assert!(
        out.status.success(),
        "curl {method} {key}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out.stdout
}

/// The AWS CLI (v1 or v2) against the test server: `aws --endpoint-url ENDPOINT ARGS...`,
/// asserted to succeed. No config or credentials files of the user are read.
///
/// The CLI sends every upload with `Expect: 100-continue`; now and then (with Garage 2.5,
/// CLI v1.45 and v2.9 alike) it misreads the answer ("Failed to parse headers") and waits
/// for its read timeout, 60 s by default, before it retries. A shorter timeout keeps such a
/// retry cheap; it is not a limit on how long anything may take (the CLI retries).
pub fn aws(s3: &S3, args: &[&str]) -> std::process::Output {
    let out = Command::new("aws")
        .arg("--endpoint-url")
        .arg(&s3.endpoint)
        .args(["--cli-read-timeout", "10"])
        .args(args)
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_ACCESS_KEY_ID", &s3.key)
        .env("AWS_SECRET_ACCESS_KEY", &s3.secret)
        // v1 reads only AWS_DEFAULT_REGION; Garage rejects signatures for another region.
        .env("AWS_DEFAULT_REGION", &s3.region)
        .env("AWS_REGION", &s3.region)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_PAGER", "")
        .env("PYTHONIOENCODING", "utf-8")
        // Newer CLIs add CRC checksums to every request unless told not to.
        .env("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
        .env("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
        .env_remove("AWS_CA_BUNDLE")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_PROFILE")
        .output()
        .expect("the AWS CLI (Debian package awscli) is installed by scripts/test");
    assert!(
        out.status.success(),
        "aws {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
