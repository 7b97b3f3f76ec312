//! Reading objects: a plain GET, and the ranged GETs of `RangedSource`
//! (through `direct` for plain-http endpoints, else ureq).

use std::any::Any;
use std::io::{self, Read};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use ferry_engine::entry::Meta;
use ferry_engine::piece::{with_piece_buffer, DIRECT_ALIGN};
use ferry_engine::ranged::{Fetch, Sink};
use ferry_engine::store::{RangedSource, SourceFile, RANGE_PIECE};
use rusty_s3::actions::{GetObject, HeadObject};
use rusty_s3::S3Action;

use crate::direct;
use crate::fail::{self, Reach};
use crate::parse::{header_mtime, md5_from_headers, meta_from_headers};
use crate::transport::{backoff, Conn, ATTEMPTS, SIGN_TTL};

/// An object being read. Nothing is requested until the first `read`: a
/// writer may instead fetch it as parallel ranges (`RangedSource`) or copy
/// it server-side.
pub struct S3Reader {
    pub(crate) c: Arc<Conn>,
    pub(crate) key: String,
    pub(crate) body: Option<ureq::BodyReader<'static>>,
    /// Size and ETag, once asked.
    pub(crate) ident: OnceLock<(u64, String)>,
    /// Exact metadata, from the GET's or the HEAD's headers.
    pub(crate) meta: OnceLock<Meta>,
    /// Its `X-Amz-Meta-Md5chksum`, from the HEAD's headers.
    pub(crate) md5: OnceLock<String>,
}

impl SourceFile for S3Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.body.is_none() {
            let a = GetObject::new(&self.c.bucket, self.c.creds(), &self.key);
            let resp = self.c.call("GET", &self.key, a, &[], None)?;
            let h = resp.headers();
            if header_mtime(h, &self.key, &self.c.odd).is_some() {
                let _ = self
                    .meta
                    .set(meta_from_headers(h, 0, None, &self.key, &self.c.odd));
            }
            self.body = Some(resp.into_body().into_reader());
        }
        self.body.as_mut().expect("opened").read(buf)
    }

    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    fn ranged(&self) -> Option<&dyn RangedSource> {
        Some(self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }

    fn meta(&self) -> Option<Meta> {
        self.meta.get().copied()
    }
}

impl S3Reader {
    /// A ranged GET through ureq (retrying what `Conn::send` retries): the
    /// body of a `206`, or of a `200` for a range from the start.
    pub(crate) fn get_range_ureq(
        &self,
        url: &url::Url,
        range: &str,
        etag: &str,
        at: u64,
    ) -> io::Result<ureq::BodyReader<'static>> {
        // `If-Match`: every range comes from the same version, or the
        // request fails (412) instead of mixing two versions.
        let resp = self.c.send("GET", &self.key, || {
            let mut r = self.c.agent.get(url.as_str()).header("range", range);
            if !etag.is_empty() {
                r = r.header("if-match", etag);
            }
            r.call()
        })?;
        if resp.status().as_u16() != 206 && at != 0 {
            return Err(io::Error::other(format!(
                "GET {}: the server ignored the byte range (HTTP {})",
                self.key,
                resp.status().as_u16()
            )));
        }
        Ok(resp.into_body().into_reader())
    }
}

/// An attempt at a range that broke in a way worth another one: the
/// parts of the error told if it was the last.
#[derive(Debug)]
enum Broke {
    /// The direct path found no connection or no answer.
    Direct {
        reach: Reach,
        msg: String,
        range: String,
    },
    /// The body broke off (or ran past the range).
    Body { e: io::Error, range: String },
}

impl std::fmt::Display for Broke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Broke::Direct { msg, range, .. } => write!(f, "GET ({range}): {msg}"),
            Broke::Body { e, range } => write!(f, "GET ({range}): {e}"),
        }
    }
}

impl std::error::Error for Broke {}

impl Fetch for S3Reader {
    fn identity(&self) -> io::Result<(u64, String)> {
        if let Some(v) = self.ident.get() {
            return Ok(v.clone());
        }
        let a = HeadObject::new(&self.c.bucket, self.c.creds(), &self.key);
        let resp = self.c.call("HEAD", &self.key, a, &[], None)?;
        let h = resp.headers();
        // Without ferry's or rclone's metadata the listing's LastModified
        // (milliseconds) is better than this header's (seconds).
        if header_mtime(h, &self.key, &self.c.odd).is_some() {
            let _ = self
                .meta
                .set(meta_from_headers(h, 0, None, &self.key, &self.c.odd));
        }
        if let Some(m) = md5_from_headers(h) {
            let _ = self.md5.set(m);
        }
        let size = h
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .ok_or_else(|| io::Error::other(format!("HEAD {}: no Content-Length", self.key)))?;
        let etag = h
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        Ok(self.ident.get_or_init(|| (size, etag)).clone())
    }

    /// One GET of the rest of the range, its body handed over in pieces
    /// that sit aligned in memory and end on 4 KiB boundaries of the
    /// object, so the writer can send them to disk with O_DIRECT.
    fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()> {
        let (_, etag) = Fetch::identity(self)?;
        if let Some(why) = self.c.health.gone() {
            return Err(self.c.unreachable(why));
        }
        let url = GetObject::new(&self.c.bucket, self.c.creds(), &self.key).sign(SIGN_TTL);
        let (at, end) = (sink.at(), sink.end());
        let range = format!("bytes={}-{}", at, end - 1);
        let mut direct_body;
        let mut ureq_body;
        let body: &mut dyn Read = match self
            .c
            .direct
            .as_ref()
            .filter(|d| d.is_on())
            .map(|d| d.get(&url, at, end, &etag))
        {
            Some(Ok(direct::Get::Body(b))) => {
                self.c.health.note(Reach::Answered);
                self.c.counters.direct_gets.fetch_add(1, Ordering::Relaxed);
                direct_body = b;
                &mut direct_body
            }
            // No connection or no answer: like a connection broken
            // mid-body, ask again after a pause.
            Some(Err(e)) => {
                let (reach, msg) = fail::io_reach(&e, &self.c.endpoint, self.c.timeout);
                self.c.note(reach, msg.starts_with("no answer"));
                return Err(io::Error::other(Broke::Direct { reach, msg, range }));
            }
            other => {
                if other.is_some() {
                    self.c
                        .counters
                        .direct_fallbacks
                        .fetch_add(1, Ordering::Relaxed);
                }
                ureq_body = self.get_range_ureq(&url, &range, &etag, at)?;
                &mut ureq_body
            }
        };
        let broke = |e| {
            io::Error::other(Broke::Body {
                e,
                range: range.clone(),
            })
        };
        with_piece_buffer(|buf| loop {
            if sink.at() == end {
                // Read the end of the body too: only then does the
                // connection go back to the pool for the next range.
                let mut last = [0u8; 1];
                return match body.read(&mut last) {
                    Ok(0) => Ok(()),
                    Ok(_) => Err(broke(io::Error::other("longer than the range asked"))),
                    Err(e) => Err(broke(e)),
                };
            }
            // Gather up to a full piece per hand-over (few, large writes).
            let want = piece_len(sink.at(), end, sink.piece_max());
            let mut n = 0;
            let mut stop: Option<io::Error> = None;
            while n < want {
                match body.read(&mut buf[n..want]) {
                    Ok(0) => {
                        stop = Some(io::ErrorKind::UnexpectedEof.into());
                        break;
                    }
                    Ok(k) => n += k,
                    Err(e) => {
                        stop = Some(e);
                        break;
                    }
                }
            }
            // What arrived counts, even if the connection broke after.
            if n > 0 {
                sink.put(&buf[..n])?;
            }
            if let Some(e) = stop {
                return Err(broke(e));
            }
        })
    }

    /// A broken attempt is made again from the last byte handed over, up
    /// to `ATTEMPTS` in all, after a pause.
    fn again(&self, e: io::Error, attempt: u32) -> io::Result<()> {
        if !e.get_ref().is_some_and(|i| i.is::<Broke>()) {
            return Err(e);
        }
        if attempt < ATTEMPTS {
            backoff(attempt);
            return Ok(());
        }
        let broke = e.into_inner().and_then(|i| i.downcast::<Broke>().ok());
        Err(match broke.map(|b| *b) {
            Some(Broke::Direct { reach, msg, range }) => {
                self.c.gave_up(reach, &msg).unwrap_or_else(|| {
                    let url = self.c.url_of(&self.key);
                    io::Error::other(format!("GET {url} ({range}): {msg}"))
                })
            }
            Some(Broke::Body { e, range }) => {
                io::Error::other(format!("GET {} ({range}): {e}", self.key))
            }
            None => io::Error::other("a broken GET"),
        })
    }
}

/// How many bytes to gather for the piece at `at` of a range ending at
/// `end`: at most `max` (and [`RANGE_PIECE`]), ending on a
/// [`DIRECT_ALIGN`] boundary of the object unless the range ends first.
pub(crate) fn piece_len(at: u64, end: u64, max: usize) -> usize {
    const A: u64 = DIRECT_ALIGN as u64;
    let max = max.min(RANGE_PIECE) as u64;
    let mut want = (end - at).min(max);
    if !at.is_multiple_of(A) {
        // Up to the next boundary first (a range resumed mid-block).
        want = want.min(A - at % A);
    } else if at + want < end && want >= A {
        want -= want % A;
    }
    want as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_end_on_block_boundaries() {
        let a = DIRECT_ALIGN as u64;
        let big = 64 << 20;
        assert_eq!(piece_len(0, big, usize::MAX), RANGE_PIECE);
        // Mid-block: up to the boundary, then whole pieces.
        assert_eq!(piece_len(a + 10, big, usize::MAX), a as usize - 10);
        // A limiter's odd chunk is cut to whole blocks...
        assert_eq!(piece_len(0, big, 20_000), 4 * a as usize);
        // ...except at the end of the range.
        assert_eq!(piece_len(big - 100, big, 20_000), 100);
        assert_eq!(piece_len(0, 5000, usize::MAX), 5000);
        // A limiter chunk below a block is kept.
        assert_eq!(piece_len(0, big, 1000), 1000);
    }
}
