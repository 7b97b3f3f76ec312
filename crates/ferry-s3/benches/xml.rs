//! Reading one ListObjectsV2 page of 1,000 keys, as `S3Store::list` needs
//! it (key, size, LastModified as epoch time, a fingerprint of the ETag):
//! - `list_page_1000/quick_xml`: `ferry_s3::xml::list_page`, the reader
//!   the store uses (quick-xml's pull parser, text borrowed from the body);
//! - `list_page_1000/rusty_s3`: rusty-s3's `ListObjectsV2::parse_response`
//!   (instant-xml into owned strings) followed by the hand-written date
//!   parse and the fingerprint, the way listings were read before;
//! - `list_page_1000/substring`: the hand-written substring search that
//!   read S3's other answers (`<Contents>` blocks, then each field).
//!
//! Listing a wide prefix reads one such page per request, so this is the
//! parse cost per 1,000 keys of a listing.

use criterion::{criterion_group, criterion_main, Criterion};
use rusty_s3::actions::ListObjectsV2;
use std::hint::black_box;

/// A page as Garage and AWS write it.
fn page() -> String {
    let mut s = String::from(
        r#"<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name><Prefix>data/</Prefix><KeyCount>1000</KeyCount><MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter><IsTruncated>true</IsTruncated><EncodingType>url</EncodingType><NextContinuationToken>ZGF0YS9mMDAwOTk5</NextContinuationToken>"#,
    );
    for i in 0..1000 {
        // Keys URL-encoded, as asked with `encoding-type=url`.
        let name = if i % 10 == 0 {
            format!("data%2Ff{i:06}+%26+co.txt")
        } else {
            format!("data%2Ff{i:06}.txt")
        };
        s.push_str(&format!(
            "<Contents><Key>{name}</Key><LastModified>2024-01-02T03:{:02}:{:02}.{:03}Z</LastModified>\
<ETag>&quot;{:032x}&quot;</ETag><Size>{}</Size><StorageClass>STANDARD</StorageClass></Contents>",
            i / 60 % 60,
            i % 60,
            i % 1000,
            u128::from(i as u32) * 0x9e37_79b9_7f4a_7c15,
            i * 37
        ));
    }
    s.push_str("</ListBucketResult>");
    s
}

fn fnv(etag: &str, t: (i64, u32)) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in etag
        .trim_matches('"')
        .bytes()
        .chain(t.0.to_le_bytes())
        .chain(t.1.to_le_bytes())
    {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

/// The hand-written ISO date reader the listing used with rusty-s3.
fn iso_date(s: &str) -> Option<(i64, u32)> {
    let n = |a: usize, b: usize| s.get(a..b)?.parse::<i64>().ok();
    let (y, mo, d) = (n(0, 4)?, n(5, 7)?, n(8, 10)?);
    let (h, mi, se) = (n(11, 13)?, n(14, 16)?, n(17, 19)?);
    let ns = s[19..].strip_prefix('.').map_or(0, |f| {
        let digits: String = f.chars().take_while(char::is_ascii_digit).take(9).collect();
        format!("{digits:0<9}").parse().unwrap_or(0)
    });
    let y = if mo <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some((days * 86_400 + h * 3600 + mi * 60 + se, ns))
}

fn field<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&format!("</{name}>"))? + start;
    Some(&body[start..end])
}

fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn url_decode(s: &str) -> String {
    let plus = s.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8()
        .map_or_else(|_| s.to_string(), |d| d.into_owned())
}

fn by_substring(body: &str) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find("<Contents>") {
        let after = &rest[i + 10..];
        let Some(j) = after.find("</Contents>") else {
            break;
        };
        let c = &after[..j];
        let t = field(c, "LastModified")
            .and_then(iso_date)
            .unwrap_or((0, 0));
        out.push((
            url_decode(&unescape(field(c, "Key").unwrap_or(""))),
            field(c, "Size").and_then(|s| s.parse().ok()).unwrap_or(0),
            fnv(&unescape(field(c, "ETag").unwrap_or("")), t),
        ));
        rest = &after[j..];
    }
    out
}

fn by_rusty_s3(body: &str) -> Vec<(String, u64, u64)> {
    let page = ListObjectsV2::parse_response(body).expect("page");
    page.contents
        .into_iter()
        .map(|c| {
            let t = c
                .last_modified
                .as_deref()
                .and_then(iso_date)
                .unwrap_or((0, 0));
            let v = fnv(c.etag.as_deref().unwrap_or(""), t);
            (c.key, c.size.unwrap_or(0), v)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let body = page();
    let new = ferry_s3::xml::list_page(&body).expect("page");
    let old = by_rusty_s3(&body);
    assert_eq!(new.contents.len(), 1000);
    assert_eq!(old.len(), 1000);
    assert_eq!(by_substring(&body).len(), 1000);
    for (n, o) in new.contents.iter().zip(&old) {
        assert_eq!((&n.key, n.size, n.version), (&o.0, o.1, o.2));
    }
    let mut g = c.benchmark_group("list_page_1000");
    g.bench_function("quick_xml", |b| {
        b.iter(|| ferry_s3::xml::list_page(black_box(&body)).expect("page"))
    });
    g.bench_function("rusty_s3", |b| b.iter(|| by_rusty_s3(black_box(&body))));
    g.bench_function("substring", |b| b.iter(|| by_substring(black_box(&body))));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
