//! Shared helpers of the tests against a real S3 server (Garage, started by `scripts/test`
//! through `scripts/garage`).

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// Where a test's S3 server is.
pub struct S3 {
    pub endpoint: String,
    pub bucket: String,
    pub key: String,
    pub secret: String,
    pub region: String,
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
        endpoint: get("ENDPOINT"),
        bucket: get("BUCKET"),
        key: get("KEY"),
        secret: get("SECRET"),
        region: get("REGION"),
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

impl S3 {
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
