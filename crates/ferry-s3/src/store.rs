//! The `Store` implementation: the bucket prefix as a tree of
//! directories (prefixes) and files (objects).
//!
//! (Over 800 lines: one trait implementation, every Store method of the S3 backend in one place.)

use std::ffi::CStr;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::hash::{Hash, HashKind, HashSet};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::store::{
    Absent, Cleanup, Committing, Features, ListError, MetaChange, Planned, RangedSource, Report,
    SourceFile, Store,
};
use rusty_s3::actions::{DeleteObjects, HeadBucket, HeadObject, ListObjectsV2, ObjectIdentifier};
use rusty_s3::{Bucket, S3Action, UrlStyle};

use crate::check::Cond;
use crate::config::{ConfigError, S3Config};
use crate::direct;
use crate::etag;
use crate::fail::{self, Health};
use crate::multipart::{Multipart, COPY_MAX, PART_SIZE};
use crate::parse::{
    check_key, encode_key, format_mtime, header_mtime, md5_from_headers, meta_from_headers,
    OddMeta, META_MD5, META_MODE, META_MTIME,
};
use crate::reader::S3Reader;
use crate::transport::{Conn, Counters, SIGN_TTL};
use crate::xml;

/// An S3 bucket and key prefix as a tree.
pub struct S3Store {
    pub(crate) c: Arc<Conn>,
    /// Key prefix of the root: empty or ending in `/`.
    pub(crate) root: String,
    pub(crate) head_threads: usize,
    /// List without a HEAD per object (see `Store::approximate_meta`).
    pub(crate) lazy_meta: bool,
    /// The server refused a DeleteObjects: delete one key per request.
    pub(crate) no_batch_delete: AtomicBool,
    /// The server refused a conditional request (`If-Match`,
    /// `If-None-Match`): the acts go without (see `check`).
    pub(crate) no_conditions: AtomicBool,
    /// What the store was made of (another bucket on the same server
    /// is reached with it: kept objects).
    pub(crate) cfg: Box<S3Config>,
    /// Stores of other buckets kept objects go to.
    pub(crate) others: crate::keep::Others,
}

/// A "directory": a key prefix, empty or ending in `/`.
#[derive(Debug, Clone)]
pub struct S3Dir {
    pub(crate) prefix: String,
}

/// An object being written: buffered until it is big enough for a
/// multipart upload, committed by the final PUT or completion.
pub struct S3Writer {
    pub(crate) key: String,
    pub(crate) meta: Meta,
    pub(crate) buf: Vec<u8>,
    pub(crate) upload: Option<Multipart>,
    /// Server-side copy from this `/bucket/key` (encoded) at commit.
    pub(crate) copy_from: Option<(String, u64, Option<String>)>,
    /// What the key must hold when the commit writes it
    /// (`Store::expect`): `Some(None)` nothing, `Some(Some(p))` the object
    /// planned; `None`: not asked.
    pub(crate) expect: Option<Option<Planned>>,
}

/// An object to HEAD: name in its directory, listed size, fallback mtime.
pub(crate) type HeadArg<'a> = (&'a str, u64, Option<(i64, u32)>);

impl S3Writer {
    /// A new object `key` with `meta`, nothing written yet.
    pub(crate) fn new(key: String, meta: &Meta) -> S3Writer {
        S3Writer {
            key,
            meta: *meta,
            buf: Vec::new(),
            upload: None,
            copy_from: None,
            expect: None,
        }
    }
}

impl S3Store {
    /// The object at the root itself (`s3://bucket/KEY` naming one object
    /// rather than a prefix): its metadata, `None` when there is none.
    pub fn root_object(&self) -> io::Result<Option<Meta>> {
        let key = self.root.trim_end_matches('/');
        if key.is_empty() {
            return Ok(None);
        }
        check_key(key)?;
        self.head_if_any(key)
    }

    /// Metadata of the object `key` as a listing and [`Store::refine`] give
    /// it (`None`: there is none): a HEAD and, for an object without a
    /// usable `x-amz-meta-mtime` (uploaded by another tool), the listing's
    /// entry of the key too, for its LastModified to the millisecond where
    /// the server keeps them (Garage; the HEAD's Last-Modified has whole
    /// seconds) and its version fingerprint (ETag and LastModified). So the
    /// stat right before bisync replaces or deletes an object sees what its
    /// listing saw, not a change that is only a coarser clock, and sees a
    /// new upload within the same second by its ETag.
    pub(crate) fn stat_key(&self, key: &str) -> io::Result<Option<Meta>> {
        self.c.counters.heads.fetch_add(1, Ordering::Relaxed);
        let a = HeadObject::new(&self.c.bucket, self.c.creds(), key);
        let resp = match self.c.call("HEAD", key, a, &[], None) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let h = resp.headers();
        let meta = meta_from_headers(h, 0, None, key, &self.c.odd);
        if header_mtime(h, key, &self.c.odd).is_some() {
            return Ok(Some(meta));
        }
        let etag = h
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // The key itself sorts first among the keys it prefixes.
        let mut a = ListObjectsV2::new(&self.c.bucket, self.c.creds());
        a.with_prefix(key);
        a.with_delimiter("/");
        a.with_max_keys(1);
        let page = self
            .fetch_list(key, a)?
            .map_err(|why| io::Error::other(format!("LIST {key}: {why}")))?;
        Ok(Some(match page.contents.first() {
            Some(o)
                if o.key == key
                    && o.size == meta.size
                    && o.version != 0
                    && o.version == crate::listing::version(etag.as_deref(), o.last_modified) =>
            {
                let (mtime_sec, mtime_nsec) = o.last_modified.unwrap_or_default();
                Meta {
                    mtime_sec,
                    mtime_nsec,
                    version: o.version,
                    ..meta
                }
            }
            // Replaced between the two requests: as the HEAD saw it (a
            // change to whoever compares).
            _ => meta,
        }))
    }

    /// HEAD an object: `None` when there is none.
    pub(crate) fn head_if_any(&self, key: &str) -> io::Result<Option<Meta>> {
        match self.head(key, 0, None) {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

mod ext;
mod helpers;

impl Store for S3Store {
    type Dir = S3Dir;
    type Reader = S3Reader;
    type Writer = S3Writer;
    type Delta = Absent;
    type Xattrs = Absent;
    type Keep = S3Store;
    type Posix = Absent;
    type Hashes = S3Store;
    type Links = Absent;
    type Pipeline = S3Store;

    fn features(&self) -> Features {
        Features {
            approximate_meta: self.lazy_meta,
            latency_bound: true,
            preserves_owner: false,
            local_modes: false,
            dir_meta: false,
            inodes: false,
            empty_dirs: false,
            dir_write_lanes: usize::MAX,
            mtime_step_ns: 1,
        }
    }
    fn delta(&self) -> Option<&Absent> {
        None
    }
    fn xattrs(&self) -> Option<&Absent> {
        None
    }
    fn keeper(&self) -> Option<&S3Store> {
        Some(self)
    }
    fn posix(&self) -> Option<&Absent> {
        None
    }
    fn hashes(&self) -> Option<&S3Store> {
        Some(self)
    }
    fn links(&self) -> Option<&Absent> {
        None
    }
    fn pipeline(&self) -> Option<&S3Store> {
        Some(self)
    }
    fn cleanup(&self) -> Option<&dyn Cleanup> {
        Some(self)
    }
    fn free_space(&self, _dir: &S3Dir) -> Option<(u64, u64)> {
        None
    }

    fn open_root(&self) -> io::Result<Option<(S3Dir, Meta)>> {
        let a = HeadBucket::new(&self.c.bucket, self.c.creds());
        self.c.call("HEAD", "", a, &[], None)?;
        Ok(Some((
            S3Dir {
                prefix: self.root.clone(),
            },
            dir_meta(),
        )))
    }

    fn create_root(&self) -> io::Result<S3Dir> {
        Ok(S3Dir {
            prefix: self.root.clone(),
        })
    }

    fn list(
        &self,
        dir: &S3Dir,
        _rel: &[u8],
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        out.clear();
        // (name, size, LastModified, version fingerprint)
        let mut files = Vec::new();
        // Names that are also prefixes (`a` and `a/...`): directories here.
        let mut prefixes: Vec<String> = Vec::new();
        for page in self.list_dir_pages(&dir.prefix)? {
            for c in page.contents {
                let name = &c.key[dir.prefix.len().min(c.key.len())..];
                // A "directory marker" object (the prefix itself) is not an entry.
                if name.is_empty() || !c.key.starts_with(&dir.prefix) {
                    continue;
                }
                if name == "." || name == ".." {
                    errors.push(self.unnamable(name, &c.key));
                    continue;
                }
                files.push((name.to_string(), c.size, c.last_modified, c.version));
            }
            for p in page.common_prefixes {
                let raw = &p[dir.prefix.len().min(p.len())..];
                let name = raw.trim_end_matches('/');
                if matches!(raw, "/" | "./" | "../") {
                    // `a//b`, `a/./b`, `a/../b`: no file path can name them.
                    errors.push(self.unnamable(raw, &p));
                    continue;
                }
                if name.is_empty() {
                    continue;
                }
                out.push(name.as_bytes(), dir_meta());
                prefixes.push(name.to_string());
            }
        }
        if !prefixes.is_empty() && !files.is_empty() {
            // An object `a` beside objects `a/...`: a tree cannot have a file
            // and a directory of one name. The directory is kept (it holds
            // more), the object reported and left alone.
            prefixes.sort_unstable();
            files.retain(|(name, ..)| {
                if prefixes.binary_search(name).is_err() {
                    return true;
                }
                let key = format!("{}{name}", dir.prefix);
                errors.push(ListError {
                    name: name.as_bytes().to_vec(),
                    err: io::Error::other(format!(
                        "is both an object and a prefix (s3://{b}/{key} and s3://{b}/{key}/...): skipped the object",
                        b = self.c.bucket.name()
                    )),
                });
                false
            });
        }
        if self.lazy_meta {
            // Size exact, mtime from LastModified until `refine` asks.
            for (name, size, lm, v) in &files {
                let (mtime_sec, mtime_nsec) = lm.unwrap_or((0, 0));
                out.push(
                    name.as_bytes(),
                    Meta {
                        kind: Kind::File,
                        size: *size,
                        mtime_sec,
                        mtime_nsec,
                        mode: 0o644,
                        uid: 0,
                        gid: 0,
                        ino: 0,
                        version: *v,
                        rdev: 0,
                        sparse: false,
                        nlink: 0,
                        dev: 0,
                        ctime: 0,
                    },
                );
            }
            out.sort();
            return Ok(());
        }
        // mtime and mode live in object metadata, which listings do not
        // return: HEAD every object, several at a time.
        let args: Vec<HeadArg<'_>> = files
            .iter()
            .map(|(n, s, lm, _)| (n.as_str(), *s, *lm))
            .collect();
        for (i, r) in self.head_many(&dir.prefix, &args).into_iter().enumerate() {
            match r {
                Ok(m) => out.push(files[i].0.as_bytes(), m),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(err) => errors.push(ListError {
                    name: files[i].0.as_bytes().to_vec(),
                    err,
                }),
            }
        }
        out.sort();
        Ok(())
    }

    fn refine(
        &self,
        dir: &S3Dir,
        list: &mut Listing,
        which: &[usize],
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        // The listed mtime is the LastModified: the fallback of objects
        // without ferry's or rclone's metadata.
        let names: Vec<(String, u64, (i64, u32))> = which
            .iter()
            .map(|&i| {
                let e = &list.entries()[i];
                let m = &e.meta;
                let name = String::from_utf8_lossy(list.name(e)).into_owned();
                (name, m.size, (m.mtime_sec, m.mtime_nsec))
            })
            .collect();
        let args: Vec<HeadArg<'_>> = names
            .iter()
            .map(|(n, s, lm)| (n.as_str(), *s, Some(*lm)))
            .collect();
        let results = self.head_many(&dir.prefix, &args);
        for (k, r) in results.into_iter().enumerate() {
            match r {
                Ok(m) => {
                    // The listing's version fingerprint stays.
                    let e = &mut list.entries_mut()[which[k]];
                    e.meta = Meta {
                        version: e.meta.version,
                        ..m
                    };
                }
                Err(err) => errors.push(ListError {
                    name: names[k].0.as_bytes().to_vec(),
                    err,
                }),
            }
        }
        Ok(())
    }

    fn stat(&self, dir: &S3Dir, name: &CStr) -> io::Result<Option<Meta>> {
        self.stat_key(&self.key(dir, name)?)
    }

    fn open_dir(&self, parent: &S3Dir, name: &CStr) -> io::Result<S3Dir> {
        Ok(S3Dir {
            prefix: format!("{}/", self.key(parent, name)?),
        })
    }

    fn make_dir(&self, parent: &S3Dir, name: &CStr) -> io::Result<S3Dir> {
        self.open_dir(parent, name)
    }

    fn set_dir_meta(&self, _dir: &S3Dir, _meta: &Meta, _what: MetaChange) -> io::Result<()> {
        Ok(())
    }

    fn open_file(&self, dir: &S3Dir, name: &CStr) -> io::Result<S3Reader> {
        Ok(S3Reader {
            c: self.c.clone(),
            key: self.key(dir, name)?,
            body: None,
            ident: OnceLock::new(),
            meta: OnceLock::new(),
            md5: OnceLock::new(),
        })
    }

    fn create_file(&self, dir: &S3Dir, name: &CStr, meta: &Meta) -> io::Result<S3Writer> {
        Ok(S3Writer::new(self.key(dir, name)?, meta))
    }

    fn write_from(
        &self,
        _dir: &S3Dir,
        w: &mut S3Writer,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        if let Some(r) = src.as_any().and_then(|a| a.downcast_ref::<S3Reader>()) {
            if r.body.is_none() && r.c.same_server(&self.c) {
                // Same server: copied there at commit, no bytes through us.
                // The HEAD gives the engine the source's exact metadata.
                r.identity()?;
                let source = format!("/{}/{}", r.c.bucket.name(), encode_key(&r.key));
                w.copy_from = Some((source, size, r.md5.get().cloned()));
                return Ok(size);
            }
        }
        let part = PART_SIZE as usize;
        w.buf.reserve(part.min(size as usize + 1));
        let chunk_len = limit.map_or(1 << 20, |l| l.chunk());
        let mut chunk = vec![0u8; chunk_len];
        let mut total = 0u64;
        loop {
            let n = src.read(&mut chunk)?;
            if n == 0 {
                return Ok(total);
            }
            if let Some(l) = limit {
                l.acquire(n as u64);
            }
            total += n as u64;
            w.buf.extend_from_slice(&chunk[..n]);
            if total > size {
                return Ok(total);
            }
            if w.buf.len() >= part {
                // Too big for one PUT: parallel multipart from here on. The
                // upload's metadata is set now: take the source's exact one.
                if let Some(m) = src.meta() {
                    w.meta = Meta {
                        kind: w.meta.kind,
                        ..m
                    };
                }
                let first = std::mem::take(&mut w.buf);
                let rest = self.upload_parts(w, first, src, size, chunk_len, limit)?;
                return Ok(rest);
            }
        }
    }

    fn commit(
        &self,
        _dir: &S3Dir,
        w: S3Writer,
        _name: &CStr,
        meta: &Meta,
        _fsync: bool,
    ) -> io::Result<()> {
        let mut w = w;
        w.meta = *meta;
        // Checked right before the act (see `check`): one HEAD where the
        // plan saw an object; the act is conditional where servers honour it.
        let cond = match w.expect.take() {
            None => Cond::Any,
            Some(at) => Cond::of(self, &w.key, at.as_ref())?,
        };
        if let Some((source, size, md5)) = w.copy_from.take() {
            self.c
                .counters
                .server_copies
                .fetch_add(1, Ordering::Relaxed);
            return self.copy_object(&w.key, &source, size, &w.meta, md5.as_deref());
        }
        match w.upload.take() {
            None => self.conditional(&cond, |hs| self.put_with(&w.key, &w.buf, &w.meta, hs)),
            Some(up) => {
                self.conditional(&cond, |hs| self.complete(&w.key, &up.id, &up.etags, hs))?;
                // The upload was started by an earlier run: its metadata is
                // that run's. Fix it if the file's changed since.
                let now = if up.resumed {
                    Some(self.head(&w.key, 0, None)?)
                } else {
                    None
                };
                let stale = now
                    .as_ref()
                    .is_some_and(|n| !n.same_mtime(&w.meta) || n.mode != w.meta.mode);
                // The whole file's MD5 is known only now: it goes into the
                // metadata by a copy onto itself (on the server, no data
                // through us), up to the size one CopyObject can copy.
                let size = now.map_or(w.meta.size, |n| n.size);
                let md5 = up.md5.as_deref().filter(|_| size <= COPY_MAX);
                if stale || md5.is_some() {
                    self.copy_object(&w.key, &self.source_of(&w.key), size, &w.meta, md5)?;
                }
                Ok(())
            }
        }
    }

    fn expect(&self, w: &mut S3Writer, at: Option<&Planned>) {
        w.expect = Some(at.copied());
    }

    fn remove_planned(&self, dir: &S3Dir, name: &CStr, at: &Planned) -> io::Result<u64> {
        self.delete_planned(&self.key(dir, name)?, at)?;
        Ok(1)
    }

    fn abort(&self, _dir: &S3Dir, _w: S3Writer) {
        // A started multipart upload stays on the server: the next upload
        // of this key resumes it (parts already there are not sent again),
        // and `ferry cleanup` removes the ones nobody comes back for.
    }

    fn set_meta(&self, dir: &S3Dir, name: &CStr, meta: &Meta, _what: MetaChange) -> io::Result<()> {
        // Server-side copy onto itself with replaced metadata: no data
        // moves. rclone's MD5 of the object stays (the content does).
        let key = self.key(dir, name)?;
        let (_, md5) = self.head_md5(&key, 0, None)?;
        self.copy_object(&key, &self.source_of(&key), meta.size, meta, md5.as_deref())
    }

    fn remove(&self, dir: &S3Dir, name: &CStr, is_dir: bool) -> io::Result<u64> {
        if !is_dir {
            self.delete_key(&self.key(dir, name)?)?;
            return Ok(1);
        }
        self.remove_each(dir, name, &mut |_, _| {})
    }

    fn remove_each(
        &self,
        dir: &S3Dir,
        name: &CStr,
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64> {
        // Every object under the prefix, a page (one DeleteObjects) at a
        // time; the prefix itself is counted last, like a directory.
        let prefix = format!("{}/", self.key(dir, name)?);
        let mut n = 0;
        let mut token: Option<String> = None;
        let mut pager = crate::listing::Pager::new(&prefix, false, None);
        loop {
            let page = self.next_page(&mut pager, token.as_deref())?;
            let keys: Vec<String> = page.contents.iter().map(|c| c.key.clone()).collect();
            self.delete_keys(&keys)?;
            for c in &page.contents {
                // A directory marker (the prefix itself) is the directory.
                let rel = c.key.get(prefix.len()..).unwrap_or("");
                if !rel.is_empty() {
                    each(rel.as_bytes(), c.size);
                    n += 1;
                }
            }
            match page.next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        each(b"", 0);
        Ok(n + 1)
    }

    fn rename(
        &self,
        from_dir: &S3Dir,
        from_name: &CStr,
        to_dir: &S3Dir,
        to_name: &CStr,
    ) -> io::Result<()> {
        // Server-side copy (data and metadata stay on the server), then
        // delete. S3 has no "copy unless it exists": the check before it is
        // the best an object store offers.
        let from = self.key(from_dir, from_name)?;
        let to = self.key(to_dir, to_name)?;
        if self.head_if_any(&to)?.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{to}: exists"),
            ));
        }
        // The source's own metadata goes with it (and objects over 5 GiB
        // are copied in parts).
        let (meta, md5) = match self.head_md5(&from, 0, None) {
            // A directory: a prefix, whose objects would move one by one.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && !self
                        .list_page(&format!("{from}/"), false, None)?
                        .contents
                        .is_empty() =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{from}/: S3 cannot rename a prefix"),
                ));
            }
            r => r?,
        };
        self.copy_object(
            &to,
            &self.source_of(&from),
            meta.size,
            &meta,
            md5.as_deref(),
        )?;
        self.delete_key(&from)
    }

    fn rmdir(&self, dir: &S3Dir, name: &CStr) -> io::Result<()> {
        // A prefix exists only while it has objects: nothing to remove,
        // but refuse if something is still below it.
        let prefix = format!("{}/", self.key(dir, name)?);
        let page = self.list_page(&prefix, false, None)?;
        if page.contents.is_empty() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("{prefix}: not empty"),
            ))
        }
    }

    fn report(&self, role: &str) -> Report {
        let c = self.counters();
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let notes = vec![format!(
            "s3 {role}: {} HEAD requests, {} parts sent, {} parts reused from {} resumed upload(s), {} server-side copies, {} stale upload(s) aborted, {} ranged GETs on the direct path, {} sent again through the HTTP client, {} listing ranges in parallel, {} batch deletes",
            n(&c.heads),
            n(&c.parts_sent),
            n(&c.parts_reused),
            n(&c.uploads_resumed),
            n(&c.server_copies),
            n(&c.uploads_aborted),
            n(&c.direct_gets),
            n(&c.direct_fallbacks),
            n(&c.list_ranges),
            n(&c.batch_deletes)
        )];
        Report {
            warnings: self.c.odd.note(role).into_iter().collect(),
            notes,
        }
    }
}

pub(crate) fn dir_meta() -> Meta {
    Meta {
        kind: Kind::Dir,
        size: 0,
        mtime_sec: 0,
        mtime_nsec: 0,
        mode: 0o755,
        uid: 0,
        gid: 0,
        ino: 0,
        version: 0,
        rdev: 0,
        sparse: false,
        nlink: 0,
        dev: 0,
        ctime: 0,
    }
}
