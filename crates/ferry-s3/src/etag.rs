//! What an S3 ETag says about an object's content, so `--checksum` against
//! an object store reads only the other side. A single-part upload's ETag
//! is the MD5 of the content (the store offers it as an MD5 hash); a
//! multipart upload's is the MD5 of the parts' MD5s followed by
//! `-<parts>`, reproduced from the other side's bytes here
//! (`HashStore::matches_bytes`). The part size is not recorded, but uploaders
//! use a whole number of MiB, so only sizes giving that part count are
//! possible: the common ones (8 MiB: ferry, AWS CLI; 5 MiB: rclone) are
//! tried first, and a mismatch is only trusted when every possible size
//! was tried.

use std::io;

use ferry_engine::hash::feed;
use ferry_engine::store::SourceFile;
use md5::{Digest, Md5};

const MIB: u64 = 1 << 20;

/// What an ETag says about the content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// MD5 of the whole content.
    Single([u8; 16]),
    /// MD5 of the part MD5s, `parts` parts.
    Multipart {
        /// The final digest.
        digest: [u8; 16],
        /// Number of parts.
        parts: u64,
        /// Possible part sizes (MiB), most likely first.
        candidates: [u64; MAX_TRIES],
        /// How many of `candidates` are set.
        tries: usize,
        /// True when `candidates` holds every possible size.
        exhaustive: bool,
    },
}

/// Part sizes tried at most (each try reads the file once).
pub const MAX_TRIES: usize = 3;
/// Part sizes of common uploaders, in MiB, most common first.
const COMMON: [u64; 8] = [8, 5, 16, 10, 64, 32, 100, 128];

/// Parse `etag` (quotes allowed) of an object of `size` bytes; `None` when
/// it is not an MD5-based ETag ferry can reproduce.
pub fn parse(etag: &str, size: u64) -> Option<Kind> {
    let e = etag.trim_matches('"');
    let (hex, parts) = match e.split_once('-') {
        Some((h, n)) => (h, Some(n.parse::<u64>().ok()?)),
        None => (e, None),
    };
    let digest = unhex(hex)?;
    match parts {
        None => Some(Kind::Single(digest)),
        Some(0) => None,
        Some(n) => {
            // Whole-MiB part sizes s with (n-1)*s < size <= n*s.
            let lo = size.div_ceil(n).div_ceil(MIB).max(1);
            let hi = if n == 1 {
                u64::MAX
            } else {
                size.div_ceil((n - 1) * MIB).saturating_sub(1)
            };
            let lo = (lo..=hi.min(lo + 1024)).find(|s| size.div_ceil(s * MIB) == n)?;
            let mut candidates = [0u64; MAX_TRIES];
            let mut tries = 0;
            let preferred = COMMON.iter().copied().filter(|s| (lo..=hi).contains(s));
            for s in preferred.chain(lo..=hi) {
                if tries == MAX_TRIES {
                    break;
                }
                if !candidates[..tries].contains(&s) {
                    candidates[tries] = s;
                    tries += 1;
                }
            }
            Some(Kind::Multipart {
                digest,
                parts: n,
                candidates,
                tries,
                exhaustive: hi - lo < MAX_TRIES as u64,
            })
        }
    }
}

/// The content's MD5 when `etag` is a single-part upload's.
pub fn single_md5(etag: &str) -> Option<[u8; 16]> {
    match parse(etag, 0)? {
        Kind::Single(d) => Some(d),
        Kind::Multipart { .. } => None,
    }
}

/// Whether the content of a `size`-byte file has ETag `etag`; `open` opens
/// it (once per part size tried). `None` when that cannot be told: the ETag
/// is not MD5-based, or no likely part size matched but others are possible.
pub fn matches<'a>(
    open: &mut dyn FnMut() -> io::Result<Box<dyn SourceFile + 'a>>,
    size: u64,
    etag: &str,
) -> io::Result<Option<bool>> {
    let Some(kind) = parse(etag, size) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; MIB as usize];
    match kind {
        Kind::Single(want) => {
            let mut src = open()?;
            let mut h = Md5::new();
            let n = feed(&mut *src, u64::MAX, &mut buf, &mut |b| h.update(b))?;
            Ok(Some(n == size && digest(h) == want))
        }
        Kind::Multipart {
            digest: want,
            parts,
            candidates,
            tries,
            exhaustive,
        } => {
            for &part in &candidates[..tries] {
                let mut src = open()?;
                let mut all = Md5::new();
                let mut total = 0;
                for _ in 0..parts {
                    let mut h = Md5::new();
                    total += feed(&mut *src, part * MIB, &mut buf, &mut |b| h.update(b))?;
                    all.update(digest(h));
                }
                let mut extra = [0u8; 1];
                if total != size || src.read(&mut extra)? != 0 {
                    return Ok(Some(false)); // the file is not `size` long
                }
                if digest(all) == want {
                    return Ok(Some(true));
                }
            }
            Ok(exhaustive.then_some(false))
        }
    }
}

fn digest(h: Md5) -> [u8; 16] {
    let out = h.finalize();
    let mut d = [0u8; 16];
    d.copy_from_slice(&out);
    d
}

fn unhex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 {
        return None;
    }
    let mut d = [0u8; 16];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(d)
}

/// Lowercase hex of an MD5 digest.
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// MD5 of `data`, as hex (S3 part ETags).
pub fn md5_hex(data: &[u8]) -> String {
    hex(&Md5::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::BorrowedFd;

    struct Mem(Vec<u8>, usize);
    impl SourceFile for Mem {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.0.len() - self.1).min(7777);
            buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
        fn as_fd(&self) -> Option<BorrowedFd<'_>> {
            None
        }
    }

    fn multipart_etag(data: &[u8], part: usize) -> String {
        let mut all = Vec::new();
        let chunks: Vec<&[u8]> = data.chunks(part).collect();
        for c in &chunks {
            all.extend_from_slice(&Md5::digest(c));
        }
        format!("\"{}-{}\"", md5_hex(&all), chunks.len())
    }

    #[test]
    fn single_part_etag() {
        let data = b"hello world".to_vec();
        let e = format!("\"{}\"", md5_hex(&data));
        assert_eq!(e, "\"5eb63bbbe01eeed093cb22bb8f5acdc3\"");
        let open = |d: &[u8]| {
            let d = d.to_vec();
            move || Ok(Box::new(Mem(d.clone(), 0)) as Box<dyn SourceFile>)
        };
        assert_eq!(matches(&mut open(&data), 11, &e).unwrap(), Some(true));
        assert_eq!(
            matches(&mut open(b"hello worle"), 11, &e).unwrap(),
            Some(false)
        );
        assert_eq!(
            matches(&mut open(b"hello worl"), 11, &e).unwrap(),
            Some(false)
        );
    }

    #[test]
    fn multipart_etags_of_common_part_sizes() {
        // ferry and the AWS CLI (8 MiB), rclone (5 MiB), others; 11 MiB in
        // 3 parts could be 4 or 5 MiB parts, 40 MiB + 1 in 3 parts 14..20.
        for (part, len, sure) in [
            (8, 17 * MIB + 5, true),
            (5, 11 * MIB, true),
            (4, 11 * MIB, true),
            (16, 40 * MIB + 1, false),
            (19, 40 * MIB + 1, false),
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let e = multipart_etag(&data, (part * MIB) as usize);
            let mut open = || Ok(Box::new(Mem(data.clone(), 0)) as Box<dyn SourceFile>);
            assert_eq!(
                matches(&mut open, len, &e).unwrap(),
                if part == 19 { None } else { Some(true) },
                "{part} MiB parts"
            );
            let mut other = data.clone();
            other[len as usize / 2] ^= 1;
            let mut open = || Ok(Box::new(Mem(other.clone(), 0)) as Box<dyn SourceFile>);
            assert_eq!(
                matches(&mut open, len, &e).unwrap(),
                sure.then_some(false),
                "{part} MiB parts, changed"
            );
        }
    }

    #[test]
    fn unknown_etags_are_not_guessed() {
        assert_eq!(parse("\"not-an-md5\"", 10), None);
        assert_eq!(parse("abc", 10), None);
        // 3 parts cannot make 1 MiB with whole-MiB parts.
        assert_eq!(parse("5eb63bbbe01eeed093cb22bb8f5acdc3-3", MIB), None);
        assert_eq!(
            single_md5("\"5eb63bbbe01eeed093cb22bb8f5acdc3\"").map(|d| hex(&d)),
            Some("5eb63bbbe01eeed093cb22bb8f5acdc3".to_string())
        );
        assert_eq!(single_md5("5eb63bbbe01eeed093cb22bb8f5acdc3-2"), None);
    }
}
