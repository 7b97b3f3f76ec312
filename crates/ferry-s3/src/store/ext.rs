//! The extensions the S3 store has: hashes it keeps (MD5, multipart
//! ETags), keeping replaced objects by server-side copy, and the cleanup
//! of abandoned multipart uploads, and the metadata of an object just
//! written, known without asking.

use super::*;
use ferry_engine::store::{HashStore, KeepStore, PipelineStore};

impl HashStore<S3Store> for S3Store {
    fn kinds(&self) -> HashSet {
        HashSet::of(&[HashKind::Md5])
    }
    fn hash(&self, dir: &S3Dir, name: &CStr, kind: HashKind) -> io::Result<Option<Hash>> {
        // A single-part ETag is the MD5; a multipart object's MD5 is the
        // `X-Amz-Meta-Md5chksum` ferry and rclone record, when there.
        let HashKind::Md5 = kind;
        let (tag, md5) = self.etag_md5(dir, name)?;
        let from_meta = || {
            use base64::Engine as _;
            let d = base64::prelude::BASE64_STANDARD.decode(md5?).ok()?;
            d.try_into().ok()
        };
        Ok(tag
            .as_deref()
            .and_then(etag::single_md5)
            .or_else(from_meta)
            .map(Hash::Md5))
    }
    fn matches_bytes<'a>(
        &self,
        dir: &S3Dir,
        name: &CStr,
        size: u64,
        open: &mut dyn FnMut() -> io::Result<Box<dyn SourceFile + 'a>>,
    ) -> io::Result<Option<bool>> {
        let Some(tag) = self.etag_md5(dir, name)?.0 else {
            return Ok(None);
        };
        // Another object: equal ETags are the same content, and nothing is
        // read to tell other ones apart (its bytes are compared instead).
        let other = open()?;
        if let Some(o) = other.as_any().and_then(|a| a.downcast_ref::<S3Reader>()) {
            let (_, theirs) = o.identity()?;
            return Ok((theirs.trim_matches('"').eq_ignore_ascii_case(&tag)).then_some(true));
        }
        drop(other);
        etag::matches(open, size, &tag)
    }
}

impl KeepStore<S3Store> for S3Store {
    fn keeps_at(&self, base: &KeepBase) -> bool {
        S3Store::keep_base_ok(base)
    }
    fn keep(&self, dir: &S3Dir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
        self.keep_entry(dir, name, to)
    }
}

impl Cleanup for S3Store {
    fn cleanup(&self, max_age: Duration, dry_run: bool) -> io::Result<Vec<(String, String)>> {
        // The bucket must exist (an error naming it otherwise).
        self.open_root()?;
        let bucket = self.c.bucket.name();
        Ok(S3Store::cleanup(self, max_age, dry_run)?
            .into_iter()
            .map(|(key, started)| (format!("s3://{bucket}/{key}"), started))
            .collect())
    }
}

// Opens and commits are requests answered in turn (the engine keeps many
// in flight instead); what the shortcut saves is the HEAD after a commit.
impl PipelineStore<S3Store> for S3Store {
    /// Opened as any directory (no request of its own to save).
    fn open_dir_to_list(&self, parent: &S3Dir, name: &CStr) -> io::Result<S3Dir> {
        Store::open_dir(self, parent, name)
    }
    fn expect_dirs(&self, _root: &S3Dir, _dirs: &[Vec<u8>]) {}
    fn open_ahead(&self, _dir: &S3Dir, _files: &[(&CStr, u64)]) {}
    fn commit_nowait<'a>(
        &'a self,
        dir: &'a S3Dir,
        w: S3Writer,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> Committing<'a> {
        Committing::done(self.commit(dir, w, name, meta, fsync))
    }
    fn meta_after_commit(&self, written: &Meta) -> Option<Meta> {
        // Size, and mtime and mode in the object's metadata, as written
        // (x-amz-meta-mtime keeps nanoseconds); the listed version is
        // learnt from the next listing.
        (written.kind == Kind::File).then_some(Meta {
            uid: 0,
            gid: 0,
            ino: 0,
            version: 0,
            nlink: 0,
            dev: 0,
            mode: written.mode & 0o7777,
            ..*written
        })
    }
    fn create_empty(
        &self,
        _dir: &S3Dir,
        _name: &CStr,
        _meta: &Meta,
        _fsync: bool,
    ) -> io::Result<bool> {
        Ok(false)
    }
}
