//! What is read from or written into requests and answers: object
//! metadata headers, XML answers, dates, mtimes and keys.

use parking_lot::Mutex;
use std::io;

use ferry_engine::entry::{Kind, Meta};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Metadata headers.
pub(crate) const META_MTIME: &str = "x-amz-meta-mtime";
pub(crate) const META_MODE: &str = "x-amz-meta-mode";

/// rclone's whole-object MD5 (base64) of multipart objects, whose ETag is
/// not one: lets `rclone check` verify them.
pub(crate) const META_MD5: &str = "x-amz-meta-md5chksum";

/// Object metadata that could not be used (anyone who can write to a
/// bucket chooses it): ignored, and said once per run (see
/// [`OddMeta::note`]).
#[derive(Debug, Default)]
pub(crate) struct OddMeta {
    /// The first object met with unusable metadata, and what was wrong.
    first: Mutex<Option<String>>,
}

impl OddMeta {
    fn saw(&self, key: &str, what: &str, value: &str) {
        let mut f = self.first.lock();
        if f.is_none() {
            let value: String = value.chars().take(40).collect();
            *f = Some(format!("{key}: {what} {value:?}"));
        }
    }

    /// The run's one note, when some object had unusable metadata.
    pub(crate) fn note(&self, role: &str) -> Option<String> {
        let f = self.first.lock();
        f.as_ref().map(|first| {
            format!(
                "note: s3 {role}: object metadata that is not an mtime or a mode was ignored (the upload time or mode 644 used instead), e.g. {first}"
            )
        })
    }
}

/// The usable `x-amz-meta-mtime` of an object's headers: `None` when it has
/// none, or one that is not an mtime (said through `odd`).
pub(crate) fn header_mtime(
    h: &ureq::http::HeaderMap,
    key: &str,
    odd: &OddMeta,
) -> Option<(i64, u32)> {
    let v = h.get(META_MTIME)?;
    let parsed = v.to_str().ok().and_then(parse_mtime);
    if parsed.is_none() {
        odd.saw(
            key,
            "x-amz-meta-mtime",
            &String::from_utf8_lossy(v.as_bytes()),
        );
    }
    parsed
}

/// The permission bits of an object's `x-amz-meta-mode` (octal, with or
/// without the file type bits): `None` when it has none, or one that is not
/// a mode (said through `odd`).
fn header_mode(h: &ureq::http::HeaderMap, key: &str, odd: &OddMeta) -> Option<u32> {
    let v = h.get(META_MODE)?;
    let parsed = v
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.bytes().all(|b| (b'0'..=b'7').contains(&b)))
        .and_then(|s| u32::from_str_radix(s, 8).ok())
        .filter(|m| *m <= 0o177777);
    if parsed.is_none() {
        odd.saw(
            key,
            "x-amz-meta-mode",
            &String::from_utf8_lossy(v.as_bytes()),
        );
    }
    parsed.map(|m| m & 0o7777)
}

/// Metadata of an object from a HEAD's or GET's headers: `x-amz-meta-mtime`
/// and `x-amz-meta-mode` when ferry or rclone wrote them, else LastModified
/// and 0644; either of them when it is not an mtime or a mode (said once
/// through `odd`).
pub(crate) fn meta_from_headers(
    h: &ureq::http::HeaderMap,
    size: u64,
    fallback: Option<(i64, u32)>,
    key: &str,
    odd: &OddMeta,
) -> Meta {
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let size = get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(size);
    let (mtime_sec, mtime_nsec) = header_mtime(h, key, odd)
        .or(fallback)
        .or_else(|| get("last-modified").and_then(parse_http_or_iso_date))
        .unwrap_or((0, 0));
    let mode = header_mode(h, key, odd).unwrap_or(0o644);
    Meta {
        kind: Kind::File,
        size,
        mtime_sec,
        mtime_nsec,
        mode,
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

/// `X-Amz-Meta-Md5chksum` of an object (rclone's whole-object MD5).
pub(crate) fn md5_from_headers(h: &ureq::http::HeaderMap) -> Option<String> {
    h.get(META_MD5)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Standard base64 with padding (`X-Amz-Meta-Md5chksum`).
pub(crate) fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::prelude::BASE64_STANDARD.encode(data)
}

/// `1600000000.123456789`: seconds with a nanosecond fraction (rclone's format).
pub fn format_mtime(m: &Meta) -> String {
    if m.mtime_sec < 0 && m.mtime_nsec > 0 {
        // -2 s + 0.5 s is -1.5 s.
        return format!(
            "-{}.{:09}",
            -(m.mtime_sec + 1),
            1_000_000_000 - m.mtime_nsec
        );
    }
    format!("{}.{:09}", m.mtime_sec, m.mtime_nsec)
}

/// The furthest an mtime may be from the epoch, in seconds: its
/// nanoseconds fit an `i64` (years 1678 to 2262), as everywhere ferry keeps
/// them (the bisync journal).
pub const MTIME_MAX_SECS: i64 = i64::MAX / 1_000_000_000 - 1;

/// Parse rclone's mtime metadata: seconds, optionally with a fraction.
/// `None` for anything else, and for an mtime more than
/// `MTIME_MAX_SECS` from the epoch.
pub fn parse_mtime(s: &str) -> Option<(i64, u32)> {
    let s = s.trim();
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = sec.parse().ok()?;
    if !(-MTIME_MAX_SECS..=MTIME_MAX_SECS).contains(&sec) {
        return None;
    }
    if frac.is_empty() {
        return Some((sec, 0));
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nsec: u32 = digits.parse().ok()?;
    if s.starts_with('-') && nsec > 0 {
        // "-1.5" is 1.5 s before the epoch: -2 s + 0.5 s.
        return Some((sec - 1, 1_000_000_000 - nsec));
    }
    Some((sec, nsec))
}

/// Parse `2024-01-02T03:04:05.000Z` (listings, RFC 3339) or an HTTP date
/// (`Tue, 02 Jan 2024 03:04:05 GMT`, Last-Modified, RFC 2822 form) to
/// (seconds, nanoseconds) since the epoch.
pub(crate) fn parse_http_or_iso_date(s: &str) -> Option<(i64, u32)> {
    let s = s.trim();
    let t = if s.as_bytes().get(4) == Some(&b'-') {
        s.parse::<jiff::Timestamp>().ok()?
    } else {
        jiff::fmt::rfc2822::DateTimeParser::new()
            .parse_timestamp(s)
            .ok()?
    };
    // Before the epoch the fraction still counts forward from the second.
    let (sec, ns) = (t.as_second(), t.subsec_nanosecond());
    Some(if ns < 0 {
        (sec - 1, (ns + 1_000_000_000) as u32)
    } else {
        (sec, ns as u32)
    })
}

/// Refuse a key with a `.` or `..` segment (`a/../b`, `a/.`): URLs are
/// normalised (RFC 3986, WHATWG; `%2E` too) as they are built, so the
/// request would reach another key, or the bucket itself. No file path can
/// hold such a key either: listings report them (see `S3Store::list`).
pub fn check_key(key: &str) -> io::Result<()> {
    match key.split('/').find(|s| *s == "." || *s == "..") {
        None => Ok(()),
        Some(seg) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{key}: a key with a \"{seg}\" segment cannot be requested exactly (URLs remove such segments)"),
        )),
    }
}

/// What S3's URI encoding keeps as it is in an object key: letters,
/// digits, `-`, `_`, `.`, `~`, and `/` between segments.
const KEY_KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// Percent-encode a key for `x-amz-copy-source` (keeping `/`).
pub(crate) fn encode_key(key: &str) -> String {
    utf8_percent_encode(key, KEY_KEEP).to_string()
}

#[cfg(test)]
mod tests {
    use md5::{Digest, Md5};
    use rusty_s3::{Bucket, UrlStyle};

    use super::*;

    #[test]
    fn mtime_round_trip() {
        let m = Meta {
            kind: Kind::File,
            size: 0,
            mtime_sec: 1_600_000_000,
            mtime_nsec: 123_456_789,
            mode: 0o644,
            uid: 0,
            gid: 0,
            ino: 0,
            version: 0,
            rdev: 0,
            sparse: false,
            nlink: 0,
            dev: 0,
            ctime: 0,
        };
        assert_eq!(format_mtime(&m), "1600000000.123456789");
        assert_eq!(
            parse_mtime("1600000000.123456789"),
            Some((1_600_000_000, 123_456_789))
        );
        assert_eq!(
            parse_mtime("1600000000.5"),
            Some((1_600_000_000, 500_000_000))
        );
        assert_eq!(parse_mtime("1600000000"), Some((1_600_000_000, 0)));
        assert_eq!(parse_mtime("x"), None);
        // Garbage, and mtimes whose nanoseconds do not fit an i64, are not
        // mtimes (never a panic, never a wrapped value).
        for bad in [
            "",
            ".5",
            "1.5x",
            "1e9",
            "nan",
            "-9223372036854775808.5",
            "9223372036854775807",
            "-9223372036854775808",
            "99999999999999999999",
            "9300000000",
        ] {
            assert_eq!(parse_mtime(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_mtime("-9000000000.5"),
            Some((-9_000_000_001, 500_000_000))
        );
        for (sec, nsec, text) in [(-2, 500_000_000, "-1.500000000"), (-1, 1, "-0.999999999")] {
            let m = Meta {
                mtime_sec: sec,
                mtime_nsec: nsec,
                ..m
            };
            assert_eq!(format_mtime(&m), text);
            assert_eq!(parse_mtime(text), Some((sec, nsec)));
        }
        assert_eq!(parse_mtime("-1"), Some((-1, 0)));
    }

    #[test]
    fn dates() {
        assert_eq!(
            parse_http_or_iso_date("2024-01-02T03:04:05.250Z"),
            Some((1_704_164_645, 250_000_000))
        );
        assert_eq!(
            parse_http_or_iso_date("Tue, 02 Jan 2024 03:04:05 GMT"),
            Some((1_704_164_645, 0))
        );
        assert_eq!(parse_http_or_iso_date("1970-01-01T00:00:00Z"), Some((0, 0)));
        // Fractions of any length, offsets, surrounding space.
        assert_eq!(
            parse_http_or_iso_date(" 2024-01-02T03:04:05.123456789Z "),
            Some((1_704_164_645, 123_456_789))
        );
        assert_eq!(
            parse_http_or_iso_date("2024-01-02T04:04:05+01:00"),
            Some((1_704_164_645, 0))
        );
        // Before the epoch, the fraction counts forward from the second.
        assert_eq!(
            parse_http_or_iso_date("1969-12-31T23:59:59.500Z"),
            Some((-1, 500_000_000))
        );
        // HTTP dates: single-digit days, other zones.
        assert_eq!(
            parse_http_or_iso_date("Thu, 1 Jan 1970 00:00:00 GMT"),
            Some((0, 0))
        );
        assert_eq!(
            parse_http_or_iso_date("Tue, 02 Jan 2024 04:04:05 +0100"),
            Some((1_704_164_645, 0))
        );
        for bad in [
            "",
            "yesterday",
            "2024-13-02T03:04:05Z",
            "Tue, 32 Jan 2024 03:04:05 GMT",
        ] {
            assert_eq!(parse_http_or_iso_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_are_requested_exactly_or_not_at_all() {
        let b = Bucket::new(
            "http://127.0.0.1:1".parse().unwrap(),
            UrlStyle::Path,
            "b",
            "r",
        )
        .unwrap();
        // What `check_key` guards against: the URL of `trav/..` is the
        // bucket's own, that of `a/./x` is `a/x`'s.
        assert_eq!(b.object_url("trav/..").path(), "/b/");
        assert_eq!(b.object_url("a/./x").path(), "/b/a/x");
        for k in ["trav/..", "a/./x", "..", ".", "a/../b", "x/."] {
            assert!(check_key(k).is_err(), "{k}");
        }
        // Empty segments and dots inside names stay as they are.
        for (k, path) in [
            ("a//b", "/b/a//b"),
            ("/x", "/b//x"),
            ("a..b/.x/..y", "/b/a..b/.x/..y"),
            ("p/%2E%2E", "/b/p/%252E%252E"),
        ] {
            assert!(check_key(k).is_ok(), "{k}");
            assert_eq!(b.object_url(k).path(), path);
        }
    }

    #[test]
    fn base64_as_rclone_writes_it() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        // MD5 of "" as rclone's X-Amz-Meta-Md5chksum.
        assert_eq!(base64(&Md5::digest(b"")), "1B2M2Y8AsgTpgAmY7PhCfg==");
    }

    #[test]
    fn copy_source_encoding() {
        assert_eq!(encode_key("a b/c+d.txt"), "a%20b/c%2Bd.txt");
        // Unreserved characters and `/` stay; everything else is %XX of
        // its UTF-8 bytes, upper-case hex.
        assert_eq!(encode_key("A-z_0.9~/x//"), "A-z_0.9~/x//");
        assert_eq!(encode_key("100%/50% off"), "100%25/50%25%20off");
        assert_eq!(encode_key("été/日本"), "%C3%A9t%C3%A9/%E6%97%A5%E6%9C%AC");
        assert_eq!(
            encode_key("a?b#c&d=e;f:g@h,i$j'k(l)m*n!o"),
            "a%3Fb%23c%26d%3De%3Bf%3Ag%40h%2Ci%24j%27k%28l%29m%2An%21o"
        );
        assert_eq!(encode_key("tab\tnl\n"), "tab%09nl%0A");
        assert_eq!(encode_key(""), "");
    }
}
