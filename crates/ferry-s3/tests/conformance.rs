//! The backend conformance suite (crates/ferry-conformance) on the S3 store,
//! against the server of `FERRY_TEST_S3_*` (the single-node Garage that
//! `scripts/test` starts); skipped with a line saying so when unset. Each
//! test works under a key prefix of its own, removed when it ends.

use std::sync::atomic::{AtomicU64, Ordering};

use ferry_conformance::{Denied, Fixture, Outside};
use ferry_engine::keep::KeepBase;
use ferry_engine::store::Store;
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
