//! Opening an S3 store, and what its operations share: keys from names,
//! HEADs of objects, deletes one by one and in batches.

use super::*;

impl S3Store {
    /// The ETag (quotes removed, lower case) and `X-Amz-Meta-Md5chksum` of
    /// object `name` in `dir` (`--checksum`).
    pub(super) fn etag_md5(
        &self,
        dir: &S3Dir,
        name: &CStr,
    ) -> io::Result<(Option<String>, Option<String>)> {
        let key = self.key(dir, name)?;
        let a = HeadObject::new(&self.c.bucket, self.c.creds(), &key);
        let resp = self.c.call("HEAD", &key, a, &[], None)?;
        let h = resp.headers();
        let tag = h.get("etag").and_then(|v| v.to_str().ok());
        Ok((
            tag.map(|e| e.trim_matches('"').to_ascii_lowercase()),
            md5_from_headers(h),
        ))
    }

    /// Connect to the bucket described by `cfg` (no request is made yet),
    /// with the default no-progress timeout ([`fail::DEFAULT_TIMEOUT`]).
    pub fn new(cfg: &S3Config, threads: usize) -> Result<S3Store, ConfigError> {
        Self::with_timeout(cfg, threads, fail::DEFAULT_TIMEOUT)
    }

    /// [`S3Store::new`] with a request that receives (or sends) no byte
    /// for `timeout` failing (and retried): `--timeout`.
    pub fn with_timeout(
        cfg: &S3Config,
        threads: usize,
        timeout: std::time::Duration,
    ) -> Result<S3Store, ConfigError> {
        let style = if cfg.path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(
            cfg.endpoint.clone(),
            style,
            cfg.bucket.clone(),
            cfg.region.clone(),
        )
        .map_err(|source| ConfigError::Bucket {
            bucket: cfg.bucket.clone(),
            source,
        })?;
        let agent = crate::transport::agent(timeout);
        let direct = direct::Pool::for_url(bucket.base_url(), timeout);
        let mut root = cfg.prefix.trim_matches('/').to_string();
        if !root.is_empty() {
            root.push('/');
        }
        Ok(S3Store {
            c: Arc::new(Conn {
                bucket,
                creds: cfg.credentials.clone(),
                agent,
                direct,
                counters: Counters::default(),
                endpoint: cfg.endpoint.as_str().trim_end_matches('/').to_string(),
                root_url: format!("s3://{}/{}", cfg.bucket, root)
                    .trim_end_matches('/')
                    .to_string(),
                timeout,
                health: Health::default(),
                odd: OddMeta::default(),
            }),
            root,
            head_threads: threads.clamp(1, 64),
            lazy_meta: false,
            no_batch_delete: AtomicBool::new(false),
            no_conditions: AtomicBool::new(false),
            cfg: Box::new(cfg.clone()),
            others: Default::default(),
        })
    }

    /// Listings without a HEAD per object: exact sizes, approximate mtimes
    /// and modes until the engine asks for exact ones (`Store::refine`) of
    /// the objects it compares. For copy and sync, and `ls --server-mtime`.
    pub fn with_lazy_meta(mut self) -> S3Store {
        self.lazy_meta = true;
        self
    }

    /// What the store did (parts sent and reused, uploads resumed, ...).
    pub fn counters(&self) -> &Counters {
        &self.c.counters
    }
}

impl S3Store {
    pub(crate) fn key(&self, dir: &S3Dir, name: &CStr) -> io::Result<String> {
        let name = name.to_str().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "name is not UTF-8 (S3 keys must be)",
            )
        })?;
        let key = format!("{}{}", dir.prefix, name);
        check_key(&key)?;
        Ok(key)
    }

    /// HEAD an object: its metadata as ferry compares it.
    /// HEAD an object. `fallback`: the mtime to use when the object has no
    /// `x-amz-meta-mtime` (the listing's LastModified, which has
    /// milliseconds; the Last-Modified header has only seconds).
    pub(crate) fn head(
        &self,
        key: &str,
        size: u64,
        fallback: Option<(i64, u32)>,
    ) -> io::Result<Meta> {
        Ok(self.head_md5(key, size, fallback)?.0)
    }

    /// [`head`](Self::head), and the object's `X-Amz-Meta-Md5chksum`.
    pub(crate) fn head_md5(
        &self,
        key: &str,
        size: u64,
        fallback: Option<(i64, u32)>,
    ) -> io::Result<(Meta, Option<String>)> {
        self.c.counters.heads.fetch_add(1, Ordering::Relaxed);
        let a = HeadObject::new(&self.c.bucket, self.c.creds(), key);
        let resp = self.c.call("HEAD", key, a, &[], None)?;
        Ok((
            meta_from_headers(resp.headers(), size, fallback, key, &self.c.odd),
            md5_from_headers(resp.headers()),
        ))
    }

    /// HEAD several objects of `prefix` at once: (name, listed size,
    /// LastModified) → metadata, in the same order.
    pub(crate) fn head_many(&self, prefix: &str, files: &[HeadArg<'_>]) -> Vec<io::Result<Meta>> {
        self.in_parallel(files, 8, |(name, size, lm)| {
            self.head(&format!("{prefix}{name}"), *size, *lm)
        })
    }

    /// Delete `keys` (at most 1,000, one listing page): one DeleteObjects
    /// request instead of a DELETE per key. A server that refuses it (GCS's
    /// S3 API has none) gets one DELETE per key, several at a time.
    pub(crate) fn delete_keys(&self, keys: &[String]) -> io::Result<()> {
        if keys.len() > 1 && !self.no_batch_delete.load(Ordering::Relaxed) {
            match self.delete_batch(keys) {
                Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                    self.no_batch_delete.store(true, Ordering::Relaxed);
                }
                r => return r,
            }
        }
        self.in_parallel(keys, 8, |k| match self.delete_key(k) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .into_iter()
        .collect()
    }

    /// One DeleteObjects (quiet: the answer lists only the keys that
    /// failed). `Unsupported` when the server does not offer it.
    pub(crate) fn delete_batch(&self, keys: &[String]) -> io::Result<()> {
        let ids: Vec<ObjectIdentifier> = keys
            .iter()
            .map(|k| ObjectIdentifier::new(k.clone()))
            .collect();
        let mut action = DeleteObjects::new(&self.c.bucket, self.c.creds(), ids.iter());
        action.set_quiet(true);
        let url = action.sign(SIGN_TTL);
        let (body, md5) = action.body_with_md5();
        self.c
            .counters
            .batch_deletes
            .fetch_add(1, Ordering::Relaxed);
        let what = format!("{} (and {} more)", keys[0], keys.len() - 1);
        let mut resp = self.c.send("DeleteObjects", &what, || {
            self.c
                .agent
                .post(url.as_str())
                .header("content-md5", &md5)
                .send(body.as_bytes())
        })?;
        let answer = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| io::Error::other(format!("DeleteObjects {what}: {e}")))?;
        let failed = xml::delete_errors(&answer)
            .map_err(|e| io::Error::other(format!("DeleteObjects {what}: {e}")))?;
        match failed.first() {
            None => Ok(()),
            Some(e) => Err(io::Error::other(format!(
                "DELETE {}: {} {}",
                e.key, e.code, e.message
            ))),
        }
    }

    /// An object's metadata headers: mtime, mode and, when known, rclone's
    /// whole-object MD5.
    pub(crate) fn meta_headers(meta: &Meta, md5: Option<&str>) -> Vec<(&'static str, String)> {
        let mut hs = vec![
            (META_MTIME, format_mtime(meta)),
            (META_MODE, format!("{:o}", 0o100000 | meta.mode)),
        ];
        if let Some(m) = md5 {
            hs.push((META_MD5, m.to_string()));
        }
        hs
    }

    pub(crate) fn delete_key(&self, key: &str) -> io::Result<()> {
        self.delete_with(key, &[])
    }

    /// `x-amz-copy-source` of a key of this bucket.
    pub(crate) fn source_of(&self, key: &str) -> String {
        format!("/{}/{}", self.c.bucket.name(), encode_key(key))
    }
}
