//! The backend conformance suite (crates/ferry-conformance) on the S3 store,
//! against the server of `FERRY_TEST_S3_*` (the single-node Garage that
//! `scripts/test` starts); skipped with a line saying so when unset. Each
//! test works under a key prefix of its own, removed when it ends.

use std::sync::atomic::{AtomicU64, Ordering};

use ferry_conformance::{Denied, Fixture, Outside};
use ferry_engine::keep::KeepBase;
use ferry_engine::store::Store;
use ferry_engine::store::StoreExt;
use ferry_s3::{S3Config, S3Store};

struct S3 {
    cfg: S3Config,
    store: S3Store,
}

impl Fixture for S3 {
    type Store = S3Store;
    fn store(&self) -> &S3Store {
        &self.store
    }
    fn any_byte_names(&self) -> bool {
        false
    }
    fn denied(&self) -> Result<Denied<S3Store>, String> {
        // The server's key with a wrong secret: every request is refused.
        let key = self.cfg.credentials.as_ref().map(|c| c.key().to_string());
        let cfg = S3Config {
            credentials: key.map(|k| rusty_s3::Credentials::new(k, "not-the-secret")),
            ..self.cfg.clone()
        };
        let store = S3Store::new(&cfg, 4).map_err(|e| e.to_string())?;
        Ok(Denied {
            store,
            guard: Box::new(()),
        })
    }
    fn outside(&self) -> Result<Outside<S3Store>, String> {
        // Another prefix of the bucket, removed with its fixture.
        let other = s3()?;
        let store = S3Store::new(&other.cfg, 4).map_err(|e| e.to_string())?;
        Ok(Outside {
            base: KeepBase::Abs(format!("{}/{}", other.cfg.bucket, other.cfg.prefix).into_bytes()),
            store,
            guard: Box::new(other),
        })
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let (prefix, name) = self.cfg.prefix.rsplit_once('/').expect("prefix/test");
        let parent = S3Config {
            prefix: prefix.to_string(),
            ..self.cfg.clone()
        };
        if let Ok(p) = S3Store::new(&parent, 4) {
            let dir = p.create_root().expect("root");
            let name = std::ffi::CString::new(name).expect("no NUL");
            let _ = p.remove(&dir, &name, true);
        }
    }
}

fn s3() -> Result<S3, String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let var = |k: &str| {
        std::env::var(format!("FERRY_TEST_S3_{k}"))
            .map_err(|_| format!("FERRY_TEST_S3_{k} is not set (scripts/test starts Garage)"))
    };
    let endpoint = var("ENDPOINT")?;
    let prefix = format!(
        "conformance/{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let cfg = S3Config {
        endpoint: endpoint.parse().map_err(|e| format!("{endpoint}: {e}"))?,
        region: var("REGION")?,
        bucket: var("BUCKET")?,
        prefix,
        credentials: Some(rusty_s3::Credentials::new(var("KEY")?, var("SECRET")?)),
        path_style: true,
    };
    let store = S3Store::new(&cfg, 16).map_err(|e| e.to_string())?;
    Ok(S3 { cfg, store })
}

ferry_conformance::suite!(s3, s3);

/// A kept object goes to another bucket of the same server (`--backup-dir
/// s3://OTHER/prefix`): copied there server-side with its metadata, the
/// original deleted. On moto's server (`FERRY_TEST_S3M_*`), where a bucket
/// is made with a plain PUT; skipped when it is not set.
#[test]
fn keep_in_another_bucket() {
    use ferry_conformance::{file_meta, put_from, read_all, Bytes, T0};
    use ferry_engine::keep::KeepTo;
    let var = |k: &str| std::env::var(format!("FERRY_TEST_S3M_{k}"));
    let Ok(endpoint) = var("ENDPOINT") else {
        eprintln!("skipped: FERRY_TEST_S3M_* is not set (scripts/moto)");
        return;
    };
    let other = format!("ferry-keep-{}", std::process::id());
    ureq::put(&format!("{endpoint}/{other}"))
        .send_empty()
        .expect("make the other bucket");
    let cfg = S3Config {
        endpoint: endpoint.parse().unwrap(),
        region: var("REGION").unwrap(),
        bucket: var("BUCKET").unwrap(),
        prefix: format!("keep-src-{}", std::process::id()),
        credentials: Some(rusty_s3::Credentials::new(
            var("KEY").unwrap(),
            var("SECRET").unwrap(),
        )),
        path_style: true,
    };
    let s = S3Store::new(&cfg, 4).unwrap();
    let r = s.create_root().unwrap();
    let meta = file_meta(4, T0, 0o600);
    put_from(&s, &r, c"f", &mut Bytes(b"kept"), &meta).unwrap();
    let base = KeepBase::Abs(format!("{other}/old").into_bytes());
    assert!(s.can_keep(&base));
    let to = KeepTo {
        base: &base,
        path: b"d/f",
        overwrite: false,
        replacing: false,
        planned: None,
    };
    s.keep_entry(&r, c"f", &to).expect("keep in another bucket");
    assert!(s.stat(&r, c"f").unwrap().is_none());
    let o = S3Store::new(
        &S3Config {
            bucket: other,
            prefix: "old/d".into(),
            ..cfg
        },
        4,
    )
    .unwrap();
    let od = o.create_root().unwrap();
    assert_eq!(read_all(&o, &od, b"f").unwrap(), b"kept");
    let m = o.stat(&od, c"f").unwrap().expect("kept");
    assert_eq!((m.mtime_sec, m.mtime_nsec, m.mode), (T0.0, T0.1, 0o600));
    // Without overwrite, an object there is an AlreadyExists.
    put_from(&s, &r, c"f", &mut Bytes(b"next"), &meta).unwrap();
    assert_eq!(
        s.keep_entry(&r, c"f", &to).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::AlreadyExists),
        "the kept object exists"
    );
    assert_eq!(read_all(&s, &r, b"f").unwrap(), b"next");
    assert_eq!(read_all(&o, &od, b"f").unwrap(), b"kept");
    s.remove(&r, c"f", false).unwrap();
}
