//! What is read from or written into requests and answers: object
//! metadata headers, XML answers, dates, mtimes and keys.

use std::collections::HashMap;
use std::io;

use ferry_engine::entry::{Kind, Meta};

use crate::multipart::Parts;

/// Metadata headers.
pub(crate) const META_MTIME: &str = "x-amz-meta-mtime";
pub(crate) const META_MODE: &str = "x-amz-meta-mode";

/// rclone's whole-object MD5 (base64) of multipart objects, whose ETag is
/// not one: lets `rclone check` verify them.
pub(crate) const META_MD5: &str = "x-amz-meta-md5chksum";

/// Metadata of an object from a HEAD's or GET's headers: `x-amz-meta-mtime`
/// and `x-amz-meta-mode` when ferry or rclone wrote them, else LastModified.
pub(crate) fn meta_from_headers(
    h: &ureq::http::HeaderMap,
    size: u64,
    fallback: Option<(i64, u32)>,
) -> Meta {
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let size = get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(size);
    let (mtime_sec, mtime_nsec) = get(META_MTIME)
        .and_then(parse_mtime)
        .or(fallback)
        .or_else(|| get("last-modified").and_then(parse_http_or_iso_date))
        .unwrap_or((0, 0));
    let mode = get(META_MODE)
        .and_then(|m| u32::from_str_radix(m, 8).ok())
        .map_or(0o644, |m| m & 0o7777);
    Meta {
        kind: Kind::File,
        size,
        mtime_sec,
        mtime_nsec,
        mode,
        uid: 0,
        gid: 0,
        ino: 0,
    }
}

/// `X-Amz-Meta-Md5chksum` of an object (rclone's whole-object MD5).
pub(crate) fn md5_from_headers(h: &ureq::http::HeaderMap) -> Option<String> {
    h.get(META_MD5)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A ListParts answer: number → (size, ETag) of its `<Part>` elements, and
/// the next part number marker when the listing is truncated. `None` when
/// a part lacks its number, size or ETag.
pub(crate) fn parse_parts(body: &str) -> Option<(Parts, Option<u16>)> {
    let mut parts = HashMap::new();
    for p in xml_blocks(body, "Part") {
        let n: u16 = xml_field(p, "PartNumber")?.trim().parse().ok()?;
        let size: u64 = xml_field(p, "Size")?.trim().parse().ok()?;
        let etag = xml_unescape(xml_field(p, "ETag")?.trim());
        parts.insert(n, (size, etag));
    }
    let truncated = xml_field(body, "IsTruncated").is_some_and(|t| t.trim() == "true");
    let next = xml_field(body, "NextPartNumberMarker").and_then(|m| m.trim().parse().ok());
    Some((parts, next.filter(|_| truncated)))
}

/// The text of the first `<name>...</name>` element (S3 error bodies).
pub(crate) fn xml_field(body: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&format!("</{name}>"))? + start;
    Some(body[start..end].to_string())
}

/// The contents of every `<name>...</name>` element.
pub(crate) fn xml_blocks<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

pub(crate) fn xml_unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// Standard base64 with padding (`X-Amz-Meta-Md5chksum`).
pub(crate) fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::prelude::BASE64_STANDARD.encode(data)
}

/// `1600000000.123456789`: seconds with a nanosecond fraction (rclone's format).
pub fn format_mtime(m: &Meta) -> String {
    format!("{}.{:09}", m.mtime_sec, m.mtime_nsec)
}

/// Parse rclone's mtime metadata: seconds, optionally with a fraction.
pub fn parse_mtime(s: &str) -> Option<(i64, u32)> {
    let s = s.trim();
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = sec.parse().ok()?;
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
    if sec < 0 && nsec > 0 {
        // "-1.5" is 1.5 s before the epoch: -2 s + 0.5 s.
        return Some((sec - 1, 1_000_000_000 - nsec));
    }
    Some((sec, nsec))
}

/// Parse `2024-01-02T03:04:05.000Z` (listings) or an HTTP date
/// (`Tue, 02 Jan 2024 03:04:05 GMT`, Last-Modified) to epoch seconds.
pub(crate) fn parse_http_or_iso_date(s: &str) -> Option<(i64, u32)> {
    let s = s.trim();
    let (y, mo, d, h, mi, se, ns): (i64, i64, i64, i64, i64, i64, u32) =
        if s.len() >= 19 && s.as_bytes()[4] == b'-' {
            let y = s[0..4].parse().ok()?;
            let mo = s[5..7].parse().ok()?;
            let d = s[8..10].parse().ok()?;
            let h = s[11..13].parse().ok()?;
            let mi = s[14..16].parse().ok()?;
            let se = s[17..19].parse().ok()?;
            let ns = s[19..].strip_prefix('.').map_or(0, |f| {
                let digits: String = f
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .take(9)
                    .collect();
                format!("{digits:0<9}").parse().unwrap_or(0)
            });
            (y, mo, d, h, mi, se, ns)
        } else {
            let parts: Vec<&str> = s.split_whitespace().collect();
            if parts.len() < 5 {
                return None;
            }
            let months = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ];
            let mo = months.iter().position(|m| *m == parts[2])? as i64 + 1;
            let t: Vec<&str> = parts[4].split(':').collect();
            if t.len() != 3 {
                return None;
            }
            (
                parts[3].parse().ok()?,
                mo,
                parts[1].parse().ok()?,
                t[0].parse().ok()?,
                t[1].parse().ok()?,
                t[2].parse().ok()?,
                0,
            )
        };
    Some((
        days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se,
        ns,
    ))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
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

/// Percent-encode a key for `x-amz-copy-source` (keeping `/`).
pub(crate) fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
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
    fn list_parts_answers_read_whatever_their_root() {
        // moto's server: root `ListPartsResponse`, a next marker while not truncated.
        let moto = r#"<?xml version="1.0" encoding="utf-8"?>
<ListPartsResponse xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>b</Bucket><Key>k</Key><UploadId>u</UploadId><PartNumberMarker>0</PartNumberMarker><NextPartNumberMarker>1</NextPartNumberMarker><MaxParts>1000</MaxParts><IsTruncated>false</IsTruncated><Part><PartNumber>1</PartNumber><LastModified>2026-11-23T13:42:43.000Z</LastModified><ETag>"6da323ddf02915cabcfeca8b6e5eb306"</ETag><Size>6000000</Size></Part><Initiator><ID>x</ID></Initiator><StorageClass>STANDARD</StorageClass></ListPartsResponse>"#;
        let (parts, next) = parse_parts(moto).unwrap();
        assert_eq!(next, None);
        assert_eq!(
            parts[&1],
            (
                6_000_000,
                "\"6da323ddf02915cabcfeca8b6e5eb306\"".to_string()
            )
        );
        // The standard root, truncated, ETags escaped.
        let aws = "<ListPartsResult><IsTruncated>true</IsTruncated><NextPartNumberMarker>2</NextPartNumberMarker>\
<Part><PartNumber>1</PartNumber><ETag>&quot;aa&quot;</ETag><Size>5</Size></Part>\
<Part><PartNumber>2</PartNumber><ETag>&quot;bb&quot;</ETag><Size>6</Size></Part></ListPartsResult>";
        let (parts, next) = parse_parts(aws).unwrap();
        assert_eq!(next, Some(2));
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[&2], (6, "\"bb\"".to_string()));
        // A part without its size: unreadable (the caller starts afresh).
        assert!(
            parse_parts("<X><Part><PartNumber>1</PartNumber><ETag>a</ETag></Part></X>").is_none()
        );
        assert_eq!(parse_parts("<X></X>").unwrap().0.len(), 0);
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
    }
}
