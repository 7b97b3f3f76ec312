//! The S3 backend: a bucket prefix (`s3://BUCKET/PREFIX`).

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;

use ferry_engine::class::cause;
use ferry_engine::versions::has_versions_dir;
use ferry_engine::{Meta, Store};
use ferry_s3::{S3Config, S3Store};

use crate::{AnyStore, Backend, Backends, Error, Job, Jobs, Location, Opts, Root, Src, Watch};

/// The S3 backend.
pub struct S3;

/// Requests in flight for a run over an object store (latency-bound).
const REQUESTS: usize = 32;

impl Backends {
    /// A store of `cfg` with this run's `--timeout`.
    fn s3_store(&self, cfg: &S3Config, jobs: usize) -> Result<S3Store, Error> {
        let t = S3::timeout(self.settings().timeout).unwrap_or(ferry_s3::DEFAULT_TIMEOUT);
        Ok(S3Store::with_timeout(cfg, jobs, t)?)
    }
}

/// `cfg` rooted at the parent prefix of its key, and the key's last segment.
fn split_key(cfg: &S3Config) -> (Box<S3Config>, String) {
    let key = cfg.prefix.trim_end_matches('/');
    let (parent, name) = key.rsplit_once('/').unwrap_or(("", key));
    let mut c = cfg.clone();
    c.prefix = parent.to_string();
    (Box::new(c), name.to_string())
}

fn s3_error(what: &str, url: &str, e: &io::Error) -> Error {
    Error::Refused(if e.kind() == io::ErrorKind::NotFound {
        // A listing answers 404 only for the bucket.
        format!("{what} {url}: no such bucket")
    } else {
        format!("{what} {url}: {}", cause(e))
    })
}

/// The location as typed.
fn typed(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

impl Backend for S3 {
    type Root = Box<S3Config>;

    const SCHEMES: &'static [&'static str] = &["s3"];

    fn parse(reg: &Backends, loc: &Location) -> Option<Result<Box<S3Config>, Error>> {
        match loc {
            Location::Url { scheme, text } if Self::SCHEMES.contains(&scheme.as_str()) => Some(
                S3Config::from_url(text, reg.settings().s3_endpoint.as_deref())
                    .map(Box::new)
                    .map_err(Error::from),
            ),
            _ => None,
        }
    }

    fn timeout(given: Option<std::time::Duration>) -> Option<std::time::Duration> {
        Some(given.unwrap_or(ferry_s3::DEFAULT_TIMEOUT))
    }

    fn id(c: &Box<S3Config>) -> String {
        format!("s3://{}/{}", c.bucket, c.prefix.trim_matches('/'))
    }

    fn local_path(_: &Box<S3Config>) -> Option<&Path> {
        None
    }

    fn location(c: &Box<S3Config>, _: &[u8]) -> Vec<u8> {
        Self::id(c).into_bytes()
    }

    fn open(reg: &Backends, c: &Box<S3Config>, o: &Opts) -> Result<AnyStore, Error> {
        let s = reg.s3_store(c, o.jobs)?;
        Ok(AnyStore::S3(if o.lazy_meta {
            s.with_lazy_meta()
        } else {
            s
        }))
    }

    fn pair(
        _: &Backends,
        _: (&Path, &Box<S3Config>),
        _: (&Path, &Box<S3Config>),
    ) -> Option<Result<Job, Error>> {
        None
    }

    fn src(reg: &Backends, p: &Path, cfg: Box<S3Config>, force: bool) -> Result<Src, Error> {
        let u = &typed(p);
        let store = reg.s3_store(&cfg, 1)?;
        // `s3://b/key/` (or the bucket) is always a prefix; `s3://b/key`
        // is the object `key` when there is one.
        let object = if u.ends_with('/') || cfg.prefix.is_empty() {
            None
        } else {
            store.root_object().map_err(|e| s3_error("SRC", u, &e))?
        };
        let prefixed = store
            .root_has_objects()
            .map_err(|e| s3_error("SRC", u, &e))?;
        if object.is_some() {
            let key = cfg.prefix.trim_end_matches('/');
            if prefixed {
                eprintln!(
                    "ferry: note: s3://{b}/{key} is both an object and a prefix (s3://{b}/{key}/...): copying the object (end SRC with / for the prefix)",
                    b = cfg.bucket
                );
            }
            let (parent, name) = split_key(&cfg);
            return Ok(Src::One(
                Root::S3(parent),
                OsString::from(&name),
                OsString::from(name),
            ));
        }
        if !prefixed && !cfg.prefix.is_empty() && !force {
            return Err(Error::Refused(format!(
                "SRC {u}: no such prefix (no objects; --force to take it as empty)"
            )));
        }
        Ok(Src::Tree(Root::S3(cfg)))
    }

    fn dst_tree(_: &Backends, _: &Path, cfg: Box<S3Config>) -> Result<Root, Error> {
        Ok(Root::S3(cfg))
    }

    fn dst_one(
        reg: &Backends,
        p: &Path,
        cfg: Box<S3Config>,
        name: &OsStr,
    ) -> Result<(Root, OsString), Error> {
        let u = &typed(p);
        let into = u.ends_with('/') || cfg.prefix.is_empty() || {
            // A key that is a prefix already is a directory: into it, not
            // beside it (an object and a prefix of one name cannot both be
            // a file tree's).
            reg.s3_store(&cfg, 1)?
                .root_has_objects()
                .map_err(|e| s3_error("DST", u, &e))?
        };
        if into {
            return Ok((Root::S3(cfg), name.to_owned()));
        }
        let (parent, key) = split_key(&cfg);
        Ok((Root::S3(parent), OsString::from(key)))
    }

    fn replica(_: &Path, cfg: Box<S3Config>, _: &str) -> Result<Root, Error> {
        Ok(Root::S3(cfg))
    }

    fn overlap(_: &Backends, job: &Job, a: &Box<S3Config>, b: &Box<S3Config>) -> Result<(), Error> {
        let (pa, pb) = (
            a.prefix.trim_end_matches('/'),
            b.prefix.trim_end_matches('/'),
        );
        if let Some((sn, dn)) = &job.one {
            if a.bucket == b.bucket && pa == pb && sn == dn {
                let key = [pa, &sn.to_string_lossy()].join("/");
                return Err(Error::Refused(format!(
                    "SRC and DST are the same object: s3://{}/{}",
                    a.bucket,
                    key.trim_start_matches('/')
                )));
            }
            return Ok(());
        }
        let inside = |x: &str, y: &str| y.is_empty() || x == y || x.starts_with(&format!("{y}/"));
        if a.bucket == b.bucket && (inside(pa, pb) || inside(pb, pa)) {
            return Err(Error::Refused(format!(
                "SRC s3://{}/{pa} and DST s3://{}/{pb} overlap",
                a.bucket, b.bucket
            )));
        }
        Ok(())
    }

    fn same_replicas(_: &Box<S3Config>, _: &Box<S3Config>) -> Result<(), Error> {
        // A prefix has no other name: the ids compared are all there is.
        Ok(())
    }

    fn jobs(_: &Box<S3Config>) -> Jobs {
        Jobs::Requests(REQUESTS)
    }

    fn ls_entry(loc: &Location, store: &AnyStore) -> io::Result<Option<Meta>> {
        let (Location::Url { text: url, .. }, AnyStore::S3(s)) = (loc, store) else {
            return Ok(None);
        };
        let keyed = !url.ends_with('/') && parse_key(url).is_some_and(|k| !k.is_empty());
        if keyed && !s.root_has_objects()? {
            return s.root_object();
        }
        Ok(None)
    }

    fn keeps(_: &AnyStore) -> &'static str {
        "an object store keeps mode and mtime in object metadata, no owner, extended attributes or ACLs"
    }

    fn watch(_: &Box<S3Config>, _: &AnyStore, _: std::time::Duration) -> Watch {
        Watch::Polled("it cannot notify")
    }

    fn refresh(_: &AnyStore) -> Result<bool, Error> {
        Ok(false)
    }

    fn find_replica(
        reg: &Backends,
        cfg: &Box<S3Config>,
        typed: &str,
    ) -> Result<Option<(Root, Vec<u8>)>, Error> {
        let key = cfg.prefix.trim_matches('/').to_string();
        let parts: Vec<&str> = key.split('/').filter(|p| !p.is_empty()).collect();
        let fail = |e: io::Error| Error::Refused(format!("{typed}: {}", cause(&e)));
        for k in (0..=parts.len()).rev() {
            let mut c = (**cfg).clone();
            c.prefix = parts[..k].join("/");
            let store = reg.s3_store(&c, 1)?.with_lazy_meta();
            let Some((d, _)) = store.open_root().map_err(fail)? else {
                continue;
            };
            if has_versions_dir(&store, &d).map_err(fail)? {
                return Ok(Some((
                    Root::S3(Box::new(c)),
                    parts[k..].join("/").into_bytes(),
                )));
            }
        }
        Ok(None)
    }
}

/// The key part of an `s3://bucket/key` URL.
fn parse_key(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("s3://")?;
    Some(
        rest.split_once('/')
            .map_or("", |(_, k)| k.trim_start_matches('/')),
    )
}
