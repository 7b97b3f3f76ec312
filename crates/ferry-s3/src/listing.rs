//! Listing a prefix: pagination, and wide prefixes cut into key ranges
//! listed in parallel.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::Ordering;

use ferry_engine::store::ListError;
use rusty_s3::actions::ListObjectsV2;

use crate::store::S3Store;
use crate::transport::read_body;
use crate::xml::{self, ListPage};

impl S3Store {
    /// One page of a listing under `prefix` (with or without the delimiter),
    /// checked as the first page of a listing ([`Pager`]).
    pub(crate) fn list_page(
        &self,
        prefix: &str,
        delimiter: bool,
        token: Option<&str>,
    ) -> io::Result<ListPage> {
        let mut pager = Pager::new(prefix, delimiter, None);
        self.next_page(&mut pager, token)
    }

    /// Every page of the listing of one directory prefix (with the `/`
    /// delimiter). A prefix wider than one page is not paged through one
    /// request after another: once the first page shows how its names are
    /// made, the rest of the key space is cut into ranges at guessed
    /// boundaries ([`split_points`]) listed in parallel, each from its
    /// lower bound (StartAfter) to its upper bound. The ranges partition
    /// the keys exactly whatever the guesses; good guesses only make them
    /// even. Every page is checked ([`Pager`]): a listing that is not
    /// whole is an error, never a shorter listing.
    pub(crate) fn list_dir_pages(&self, prefix: &str) -> io::Result<Vec<ListPage>> {
        let mut pager = Pager::new(prefix, true, None);
        let first = self.next_page(&mut pager, None)?;
        let Some(token) = first.next.clone() else {
            return Ok(vec![first]);
        };
        let names: Vec<&str> = first
            .contents
            .iter()
            .map(|c| c.key.as_str())
            .chain(first.common_prefixes.iter().map(String::as_str))
            .map(|k| k.get(prefix.len()..).unwrap_or(""))
            .collect();
        let bounds = split_points(&names, 15);
        if bounds.is_empty() {
            // No guess: page through in order.
            let mut pages = vec![first];
            pages.extend(self.list_range(pager, Some(&token), None)?);
            return Ok(pages);
        }
        // Range 0 continues the first page up to the first bound; range i
        // covers (bounds[i-1], bounds[i]]; the last one is open. As
        // (continuation token, start after, up to), on up to 16 threads.
        let full: Vec<String> = bounds.iter().map(|b| format!("{prefix}{b}")).collect();
        let ranges: Vec<(Option<&str>, Option<&str>, Option<&str>)> = (0..=full.len())
            .map(|i| match i.checked_sub(1) {
                None => (Some(token.as_str()), None, full.first().map(String::as_str)),
                Some(j) => (
                    None,
                    Some(full[j].as_str()),
                    full.get(i).map(String::as_str),
                ),
            })
            .collect();
        self.counters()
            .list_ranges
            .fetch_add(ranges.len() as u64, Ordering::Relaxed);
        let mut pages = vec![first];
        for r in self.in_parallel(&ranges, ranges.len().div_ceil(16), |&(t, after, upto)| {
            // Range 0 goes on from the first page; the others start after
            // their lower bound.
            let p = match t {
                Some(_) => pager.clone(),
                None => Pager::new(prefix, true, after),
            };
            self.list_range(p, t, upto)
        }) {
            pages.extend(r?);
        }
        Ok(pages)
    }

    /// The pages of a listing from `token` or from after the pager's start
    /// key, up to and including key `upto` (entries past it dropped).
    fn list_range(
        &self,
        mut pager: Pager<'_>,
        token: Option<&str>,
        upto: Option<&str>,
    ) -> io::Result<Vec<ListPage>> {
        let mut pages = Vec::new();
        let mut token = token.map(str::to_string);
        loop {
            let mut page = self.next_page(&mut pager, token.as_deref())?;
            let mut past = false;
            if let Some(u) = upto {
                past = page.contents.last().is_some_and(|c| c.key.as_str() > u)
                    || page.common_prefixes.last().is_some_and(|c| c.as_str() > u);
                page.contents.retain(|c| c.key.as_str() <= u);
                page.common_prefixes.retain(|c| c.as_str() <= u);
            }
            token = page.next.take();
            pages.push(page);
            if past || token.is_none() {
                return Ok(pages);
            }
        }
    }

    /// The page of `pager`'s listing after `token` (none: its first page,
    /// from after its start key when it has one), checked.
    pub(crate) fn next_page(
        &self,
        pager: &mut Pager<'_>,
        token: Option<&str>,
    ) -> io::Result<ListPage> {
        let prefix = pager.prefix;
        let mut a = ListObjectsV2::new(&self.c.bucket, self.c.creds());
        a.with_prefix(prefix);
        if pager.delimiter {
            a.with_delimiter("/");
        }
        if let Some(t) = token {
            a.with_continuation_token(t);
        } else if let Some(s) = pager.start_after {
            a.with_start_after(s);
        }
        if let Some(n) = test_page() {
            a.with_max_keys(n);
        }
        let n = pager.pages + 1;
        let page = self
            .fetch_list(prefix, a)?
            .map_err(|why| self.bad_listing(prefix, &format!("page {n}: {why}")))?;
        pager
            .check(&page)
            .map_err(|why| self.bad_listing(prefix, &why))?;
        Ok(page)
    }

    /// Send a ListObjectsV2 and read its page: the error of a request that
    /// failed, or why its answer is no page.
    pub(crate) fn fetch_list(
        &self,
        prefix: &str,
        a: ListObjectsV2<'_>,
    ) -> io::Result<Result<ListPage, String>> {
        let mut resp = self.c.call("LIST", prefix, a, &[], None)?;
        Ok(match read_body(&mut resp) {
            Err(e) => Err(format!("the answer broke off ({e})")),
            Ok(b) if b.trim().is_empty() => Err("an empty answer".into()),
            Ok(b) => xml::list_page(&b).map_err(|e| e.to_string()),
        })
    }

    /// The error of a listing that cannot be taken as whole: it names the
    /// prefix and says why; whoever lists takes nothing under it as gone.
    fn bad_listing(&self, prefix: &str, why: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("LIST {}: incomplete listing: {why}", self.c.url_of(prefix)),
        )
    }
}

/// What the pages of one listing must agree on before it is taken as the
/// whole truth about its prefix: each page says whether it is the last
/// (`IsTruncated`), and one that is not gives a continuation token no
/// earlier page gave; every key and common prefix is under the prefix
/// (with the delimiter: one level down, a common prefix ending in it);
/// the names rise strictly, within each page and from one page to the
/// next, all after the key the listing started after.
#[derive(Clone)]
pub(crate) struct Pager<'a> {
    prefix: &'a str,
    delimiter: bool,
    start_after: Option<&'a str>,
    /// The greatest name given so far (the start key at first).
    last: Option<String>,
    tokens: HashSet<String>,
    /// Pages checked.
    pages: usize,
}

impl<'a> Pager<'a> {
    pub(crate) fn new(prefix: &'a str, delimiter: bool, start_after: Option<&'a str>) -> Self {
        Pager {
            prefix,
            delimiter,
            start_after,
            last: start_after.map(str::to_string),
            tokens: HashSet::new(),
            pages: 0,
        }
    }

    /// Check the next page; the error says what is wrong with it.
    pub(crate) fn check(&mut self, page: &ListPage) -> Result<(), String> {
        self.pages += 1;
        let n = self.pages;
        let at = |what: String| format!("page {n}: {what}");
        match (page.truncated, &page.next) {
            (None, _) => return Err(at("not a listing (no IsTruncated)".into())),
            (Some(true), None) => {
                return Err(at(
                    "IsTruncated is true but there is no continuation token".into()
                ))
            }
            (Some(true), Some(t)) if t.is_empty() => {
                return Err(at("an empty continuation token".into()))
            }
            (Some(true), Some(t)) if !self.tokens.insert(t.clone()) => {
                return Err(at(format!("continuation token {t:?} given a second time")))
            }
            _ => {}
        }
        let p = self.prefix;
        let mut prev = self.last.as_deref();
        for c in &page.contents {
            let k = c.key.as_str();
            let Some(rest) = k.strip_prefix(p) else {
                return Err(at(format!("key {k:?} is outside the prefix")));
            };
            if self.delimiter && rest.contains('/') {
                return Err(at(format!("key {k:?} is not directly under the prefix")));
            }
            if prev.is_some_and(|q| k <= q) {
                return Err(at(format!("key {k:?} out of order")));
            }
            prev = Some(k);
        }
        let mut top = prev;
        let mut prev = self.last.as_deref();
        for cp in &page.common_prefixes {
            let k = cp.as_str();
            let Some(rest) = k.strip_prefix(p) else {
                return Err(at(format!("common prefix {k:?} is outside the prefix")));
            };
            if !self.delimiter || rest.find('/') != Some(rest.len() - 1) {
                return Err(at(format!(
                    "common prefix {k:?} is not one level under the prefix"
                )));
            }
            if prev.is_some_and(|q| k <= q) {
                return Err(at(format!("common prefix {k:?} out of order")));
            }
            prev = Some(k);
        }
        if prev > top {
            top = prev;
        }
        self.last = top.map(str::to_string);
        Ok(())
    }
}

/// Tests: pages of `FERRY_TEST_S3_PAGE` keys instead of the server's
/// 1,000, so that a few hundred objects span several pages (the
/// `fault-injection` feature, which release builds lack).
#[cfg(feature = "fault-injection")]
fn test_page() -> Option<usize> {
    static PAGE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        std::env::var("FERRY_TEST_S3_PAGE")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
    })
}

/// The server's page size.
#[cfg(not(feature = "fault-injection"))]
fn test_page() -> Option<usize> {
    None
}

impl S3Store {
    /// The error of a listed key that no file path can hold: `name` (in
    /// the directory listed) is `.` or `..`, or a prefix of such a segment
    /// or of an empty one (`/`, `./`, `../`).
    pub(crate) fn unnamable(&self, name: &str, key: &str) -> ListError {
        let what = match name.trim_end_matches('/') {
            "" => "an empty segment",
            "." => "a \".\" segment",
            _ => "a \"..\" segment",
        };
        let b = self.c.bucket.name();
        let msg = if name.ends_with('/') {
            format!(
                "the keys under s3://{b}/{key} have {what}, which no file path can hold: skipped"
            )
        } else {
            format!("the key s3://{b}/{key} has {what}, which no file path can hold: skipped")
        };
        ListError {
            name: name.as_bytes().to_vec(),
            err: io::Error::new(io::ErrorKind::InvalidData, msg),
        }
    }

    /// True when at least one object's key starts with the root prefix
    /// (`KEY/`; any key in the bucket for the bucket's root). A missing
    /// bucket is an error (`NotFound`).
    pub fn root_has_objects(&self) -> io::Result<bool> {
        let mut a = ListObjectsV2::new(&self.c.bucket, self.c.creds());
        a.with_prefix(self.root.as_str());
        a.with_max_keys(1);
        let page = self
            .fetch_list(&self.root, a)?
            .and_then(|p| Pager::new(&self.root, false, None).check(&p).map(|()| p))
            .map_err(|why| self.bad_listing(&self.root, &why))?;
        Ok(!page.contents.is_empty() || !page.common_prefixes.is_empty())
    }
}

/// A fingerprint of an object's version, kept in [`Meta::version`] of listed
/// objects (an object store has no inodes): its ETag and LastModified as
/// listed (to the millisecond; a HEAD's has only seconds, so metadata from
/// a HEAD carries 0). A re-upload or a metadata rewrite changes it; 0 when
/// either is missing.
pub(crate) fn version(etag: Option<&str>, last_modified: Option<(i64, u32)>) -> u64 {
    let (Some(etag), Some((s, ns))) = (etag, last_modified) else {
        return 0;
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in etag
        .trim_matches('"')
        .bytes()
        .chain(s.to_le_bytes())
        .chain(ns.to_le_bytes())
    {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

/// Boundaries (names, rising, all after the page's last name) to cut the
/// rest of a wide listing into about `want` ranges, guessed from its first
/// page `names` (in order): where the page's first and last names first
/// differ, at position `d`, the page went through the characters seen
/// there; the names after it should move one position to the left first,
/// then two, …: a boundary is the last name up to position `p < d` with
/// its byte at `p` replaced by a larger one among those seen at `d`,
/// outer positions (the widest ranges) first until there are `want`.
/// `f000000`…`f000999` gives `f01`…`f09` and `f1`…`f9`. Only ASCII
/// positions are used (a boundary must be valid UTF-8). Empty when nothing
/// can be guessed.
pub(crate) fn split_points(names: &[&str], want: usize) -> Vec<String> {
    let (Some(first), Some(last)) = (names.first(), names.last()) else {
        return Vec::new();
    };
    let (f, l) = (first.as_bytes(), last.as_bytes());
    let Some(d) = f.iter().zip(l).position(|(a, b)| a != b) else {
        return Vec::new();
    };
    let mut seen: Vec<u8> = names
        .iter()
        .filter_map(|n| n.as_bytes().get(d).copied())
        .filter(|c| c.is_ascii() && *c != b'/')
        .collect();
    seen.sort_unstable();
    seen.dedup();
    // Outer positions first: their ranges are the widest.
    let mut out: Vec<String> = Vec::new();
    for p in 0..d {
        if !l[..=p].is_ascii() || out.len() >= want {
            break;
        }
        for &c in seen.iter().filter(|&&c| c > l[p]) {
            let mut b = l[..p].to_vec();
            b.push(c);
            out.push(String::from_utf8(b).expect("ASCII"));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod split_tests {
    use super::split_points;

    #[test]
    fn counters_move_left() {
        let names: Vec<String> = (0..1000).map(|i| format!("f{i:06}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let b = split_points(&refs, 15);
        let want: Vec<String> = (1..10)
            .map(|i| format!("f0{i}"))
            .chain((1..10).map(|i| format!("f{i}")))
            .collect();
        assert_eq!(b, want);
    }

    #[test]
    fn hashes_split_on_the_first_byte() {
        let names: Vec<String> = (0..256).map(|i| format!("0{:02x}{}", i, "ab")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let b = split_points(&refs, 15);
        assert_eq!(b.len(), 15, "{b:?}");
        assert!(b.iter().all(|x| x.as_str() > "0ffab"));
        assert!(b.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn nothing_to_guess() {
        assert!(split_points(&[], 8).is_empty());
        assert!(split_points(&["same", "same"], 8).is_empty());
        // Differing only in a non-ASCII part: no valid boundary.
        assert!(split_points(&["é1", "é2"], 8).is_empty());
    }
}

#[cfg(test)]
mod pager_tests {
    use super::Pager;
    use crate::xml::{ListPage, Object};

    fn page(
        keys: &[&str],
        prefixes: &[&str],
        truncated: Option<bool>,
        next: Option<&str>,
    ) -> ListPage {
        ListPage {
            contents: keys
                .iter()
                .map(|k| Object {
                    key: k.to_string(),
                    size: 1,
                    last_modified: None,
                    version: 0,
                })
                .collect(),
            common_prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            next: next.map(str::to_string),
            truncated,
        }
    }

    #[test]
    fn whole_listings_pass() {
        let mut p = Pager::new("d/", true, None);
        p.check(&page(
            &["d/", "d/a", "d/c"],
            &["d/b/"],
            Some(true),
            Some("t1"),
        ))
        .unwrap();
        p.check(&page(&["d/e"], &["d/d/", "d/f/"], Some(true), Some("t2")))
            .unwrap();
        p.check(&page(&[], &[], Some(false), None)).unwrap();
        // Without the delimiter keys go any depth down.
        let mut p = Pager::new("d/", false, None);
        p.check(&page(&["d/a/b", "d/a/c"], &[], Some(false), None))
            .unwrap();
        // From after a start key.
        let mut p = Pager::new("d/", true, Some("d/m"));
        p.check(&page(&["d/n"], &["d/m/"], Some(false), None))
            .unwrap();
    }

    #[test]
    fn partial_or_odd_pages_are_errors() {
        let bad: &[(&[ListPage], &str)] = &[
            (&[page(&["d/a"], &[], None, None)], "no IsTruncated"),
            (
                &[page(&["d/a"], &[], Some(true), None)],
                "no continuation token",
            ),
            (
                &[page(&["d/a"], &[], Some(true), Some(""))],
                "empty continuation token",
            ),
            (
                &[
                    page(&["d/a"], &[], Some(true), Some("t")),
                    page(&["d/b"], &[], Some(true), Some("t")),
                ],
                "given a second time",
            ),
            (
                &[page(&["e/a"], &[], Some(false), None)],
                "outside the prefix",
            ),
            (
                &[page(&["d/a/b"], &[], Some(false), None)],
                "not directly under",
            ),
            (
                &[page(&[], &["e/"], Some(false), None)],
                "outside the prefix",
            ),
            (
                &[page(&[], &["d/a/b/"], Some(false), None)],
                "not one level under",
            ),
            (
                &[page(&["d/b", "d/a"], &[], Some(false), None)],
                "out of order",
            ),
            (
                &[page(&["d/a", "d/a"], &[], Some(false), None)],
                "out of order",
            ),
            (
                &[page(&[], &["d/b/", "d/a/"], Some(false), None)],
                "out of order",
            ),
            (
                &[
                    page(&["d/c"], &[], Some(true), Some("t")),
                    page(&["d/b"], &[], Some(false), None),
                ],
                "page 2: key \"d/b\" out of order",
            ),
            (
                &[
                    page(&[], &["d/c/"], Some(true), Some("t")),
                    page(&["d/c"], &[], Some(false), None),
                ],
                "out of order",
            ),
        ];
        for (pages, want) in bad {
            let mut p = Pager::new("d/", true, None);
            let e = pages
                .iter()
                .map(|pg| p.check(pg))
                .find_map(Result::err)
                .unwrap_or_else(|| panic!("{want}: passed"));
            assert!(e.contains(want), "{e} (want {want})");
        }
        let mut p = Pager::new("d/", true, Some("d/m"));
        assert!(p
            .check(&page(&["d/a"], &[], Some(false), None))
            .unwrap_err()
            .contains("out of order"));
    }
}
