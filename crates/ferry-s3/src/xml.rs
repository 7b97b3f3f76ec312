//! S3's XML answers, read with quick-xml's pull parser straight from the
//! body: listing pages, error bodies, the multipart answers and
//! DeleteObjects results. Elements are matched by their local name under
//! their parent, whatever the root element is called (moto's differ from
//! AWS's) and in any order; unknown elements are skipped. Text is borrowed
//! from the body unless it holds an entity (`&amp;`), so a listing page
//! costs one allocation per key.

use std::borrow::Cow;
use std::collections::HashMap;

use quick_xml::escape::resolve_xml_entity;
use quick_xml::events::Event;
use quick_xml::Reader;

use crate::listing::version;
use crate::parse::parse_http_or_iso_date;

/// An answer that is not the XML it should be.
#[derive(Debug, thiserror::Error)]
pub enum XmlError {
    /// Not well-formed.
    #[error("unreadable XML answer: {0}")]
    Syntax(#[from] quick_xml::Error),
    /// An entity XML does not define.
    #[error("unreadable XML answer: unknown entity &{0};")]
    Entity(String),
    /// Well-formed, but without an element it must have.
    #[error("unreadable XML answer: {0}")]
    Missing(&'static str),
}

/// What [`walk`] hands over.
enum Node<'a, 'b> {
    /// An element without child elements: its parent's local name, its
    /// own, and its text with entities resolved.
    Leaf {
        parent: &'b [u8],
        name: &'b [u8],
        text: Cow<'a, str>,
    },
    /// The end of an element that has child elements.
    End(&'b [u8]),
}

/// Read `body`, calling `f` for every leaf element and at the end of every
/// other one. Element names are kept in buffers reused across elements.
fn walk<'a>(
    body: &'a str,
    mut f: impl FnMut(Node<'a, '_>) -> Result<(), XmlError>,
) -> Result<(), XmlError> {
    let mut r = Reader::from_str(body);
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut depth = 0;
    let mut text: Cow<'a, str> = Cow::Borrowed("");
    // The innermost open element has no child element (yet).
    let mut leaf = false;
    loop {
        match r.read_event()? {
            Event::Start(e) => {
                if names.len() == depth {
                    names.push(Vec::new());
                }
                names[depth].clear();
                names[depth].extend_from_slice(e.local_name().as_ref());
                depth += 1;
                text = Cow::Borrowed("");
                leaf = true;
            }
            Event::Empty(e) => {
                let parent = depth.checked_sub(1).map_or(&b""[..], |d| &names[d]);
                f(Node::Leaf {
                    parent,
                    name: e.local_name().as_ref(),
                    text: Cow::Borrowed(""),
                })?;
                leaf = false;
            }
            Event::Text(t) if leaf => {
                append(&mut text, t.decode().map_err(quick_xml::Error::from)?)
            }
            Event::CData(t) if leaf => {
                append(&mut text, t.decode().map_err(quick_xml::Error::from)?)
            }
            Event::GeneralRef(e) if leaf => {
                let ch;
                let s = match e.resolve_char_ref()? {
                    Some(c) => {
                        ch = c.to_string();
                        ch.as_str()
                    }
                    None => {
                        let name = e.decode().map_err(quick_xml::Error::from)?;
                        resolve_xml_entity(&name)
                            .ok_or_else(|| XmlError::Entity(name.into_owned()))?
                    }
                };
                text.to_mut().push_str(s);
            }
            Event::End(_) => {
                depth -= 1;
                let name = &names[depth];
                if leaf {
                    let parent = depth.checked_sub(1).map_or(&b""[..], |d| &names[d]);
                    let text = std::mem::replace(&mut text, Cow::Borrowed(""));
                    f(Node::Leaf { parent, name, text })?;
                } else {
                    f(Node::End(name))?;
                }
                leaf = false;
            }
            Event::Eof if depth > 0 => return Err(XmlError::Missing("cut short")),
            Event::Eof => return Ok(()),
            _ => {}
        }
    }
}

fn append<'a>(text: &mut Cow<'a, str>, more: Cow<'a, str>) {
    if text.is_empty() {
        *text = more;
    } else {
        text.to_mut().push_str(&more);
    }
}

/// One object of a listing page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub key: String,
    pub size: u64,
    /// LastModified as (seconds, nanoseconds) since the epoch.
    pub last_modified: Option<(i64, u32)>,
    /// The fingerprint of its ETag and LastModified (`version`).
    pub version: u64,
}

/// One page of a ListObjectsV2 answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ListPage {
    pub contents: Vec<Object>,
    /// Common prefixes, each ending in the delimiter.
    pub common_prefixes: Vec<String>,
    /// The continuation token of the next page, when there is one.
    pub next: Option<String>,
    /// `IsTruncated` as the page says it (`None`: the page does not say,
    /// so it is no listing page: see `listing::Pager`).
    pub truncated: Option<bool>,
}

/// Read a ListObjectsV2 answer (the listing's hot path: `benches/xml.rs`,
/// `list_page_1000`, compares it with the readers it replaced).
pub fn list_page(body: &str) -> Result<ListPage, XmlError> {
    let mut page = ListPage::default();
    let mut key: Option<Cow<'_, str>> = None;
    let mut etag: Option<Cow<'_, str>> = None;
    let (mut size, mut lm) = (0u64, None);
    let (mut truncated, mut url_encoded) = (None, false);
    walk(body, |n| {
        match n {
            Node::Leaf {
                parent: b"Contents",
                name,
                text,
            } => match name {
                b"Key" => key = Some(text),
                b"Size" => size = text.trim().parse().unwrap_or(0),
                b"LastModified" => lm = parse_http_or_iso_date(&text),
                b"ETag" => etag = Some(text),
                _ => {}
            },
            Node::Leaf {
                parent: b"CommonPrefixes",
                name: b"Prefix",
                text,
            } => page.common_prefixes.push(text.into_owned()),
            Node::Leaf {
                name: b"NextContinuationToken",
                text,
                ..
            } => page.next = Some(text.into_owned()),
            Node::Leaf {
                name: b"IsTruncated",
                text,
                ..
            } => truncated = Some(text.trim() == "true"),
            Node::Leaf {
                name: b"EncodingType",
                text,
                ..
            } => url_encoded = text.trim() == "url",
            Node::End(b"Contents") => {
                let key = key
                    .take()
                    .ok_or(XmlError::Missing("an object without its key"))?;
                page.contents.push(Object {
                    key: key.into_owned(),
                    size: std::mem::take(&mut size),
                    last_modified: lm,
                    version: version(etag.take().as_deref(), lm.take()),
                });
            }
            _ => {}
        }
        Ok(())
    })?;
    if truncated == Some(false) {
        page.next = None;
    }
    page.truncated = truncated;
    if url_encoded {
        for c in &mut page.contents {
            url_decode(&mut c.key);
        }
        for p in &mut page.common_prefixes {
            url_decode(p);
        }
    }
    Ok(page)
}

/// Decode a key of a listing asked with `encoding-type=url` (as rusty-s3's
/// `ListObjectsV2` asks): `+` is a space (AWS and MinIO encode as HTML forms
/// do), `%XX` a byte. Left as it is when that is not UTF-8.
fn url_decode(s: &mut String) {
    if !s.contains(['%', '+']) {
        return;
    }
    let plus = s.replace('+', " ");
    if let Ok(d) = percent_encoding::percent_decode_str(&plus).decode_utf8() {
        *s = d.into_owned();
    }
}

/// An `<Error>` element: the body of an error status, of a copy that
/// failed after its `200`, or one key of a DeleteObjects answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErrorBody {
    pub key: String,
    pub code: String,
    pub message: String,
}

/// Every `<Error>` in `body`, with whatever could be read before the XML
/// broke off, and how it did.
fn errors(body: &str) -> (Vec<ErrorBody>, Result<(), XmlError>) {
    let mut out = Vec::new();
    let mut cur = ErrorBody::default();
    let r = walk(body, |n| {
        match n {
            Node::Leaf {
                parent: b"Error",
                name,
                text,
            } => match name {
                b"Key" => cur.key = text.into_owned(),
                b"Code" => cur.code = text.into_owned(),
                b"Message" => cur.message = text.into_owned(),
                _ => {}
            },
            Node::End(b"Error") => out.push(std::mem::take(&mut cur)),
            _ => {}
        }
        Ok(())
    });
    if !cur.code.is_empty() {
        out.push(cur);
    }
    (out, r)
}

/// The error in an answer's body, if it holds one. Lenient: a body cut
/// short or not XML at all (a proxy's page) gives what could be read.
pub fn error_body(body: &str) -> Option<ErrorBody> {
    errors(body).0.into_iter().next()
}

/// The keys a DeleteObjects answer reports as not deleted.
pub fn delete_errors(body: &str) -> Result<Vec<ErrorBody>, XmlError> {
    let (out, r) = errors(body);
    r.map(|()| out)
}

/// The text of the first element called `name` anywhere in `body`.
fn first_text(body: &str, want: &[u8]) -> Result<Option<String>, XmlError> {
    let mut found = None;
    walk(body, |n| {
        if let Node::Leaf { name, text, .. } = n {
            if found.is_none() && name == want {
                found = Some(text.into_owned());
            }
        }
        Ok(())
    })?;
    Ok(found)
}

/// The upload id of a CreateMultipartUpload answer.
pub fn upload_id(body: &str) -> Result<String, XmlError> {
    first_text(body, b"UploadId")?.ok_or(XmlError::Missing("no UploadId"))
}

/// The ETag of an UploadPartCopy answer (quotes included).
pub fn copy_part_etag(body: &str) -> Result<String, XmlError> {
    first_text(body, b"ETag")?.ok_or(XmlError::Missing("no ETag"))
}

/// An in-progress multipart upload.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Upload {
    pub key: String,
    pub id: String,
    /// When it was started, as the server wrote it.
    pub initiated: String,
}

/// The key and upload id markers of the next page of uploads.
pub type UploadMarkers = (String, String);

/// Read a ListMultipartUploads answer: its uploads, and the markers of the
/// next page when it is truncated.
pub fn uploads_page(body: &str) -> Result<(Vec<Upload>, Option<UploadMarkers>), XmlError> {
    let mut out = Vec::new();
    let mut cur = Upload::default();
    let (mut truncated, mut key_marker, mut id_marker) = (false, None, None);
    walk(body, |n| {
        match n {
            Node::Leaf {
                parent: b"Upload",
                name,
                text,
            } => match name {
                b"Key" => cur.key = text.into_owned(),
                b"UploadId" => cur.id = text.into_owned(),
                b"Initiated" => cur.initiated = text.into_owned(),
                _ => {}
            },
            Node::End(b"Upload") => {
                let u = std::mem::take(&mut cur);
                if !u.key.is_empty() && !u.id.is_empty() {
                    out.push(u);
                }
            }
            Node::Leaf { name, text, .. } => match name {
                b"IsTruncated" => truncated = text.trim() == "true",
                b"NextKeyMarker" => key_marker = Some(text.into_owned()),
                b"NextUploadIdMarker" => id_marker = Some(text.into_owned()),
                _ => {}
            },
            _ => {}
        }
        Ok(())
    })?;
    let next = match (truncated, key_marker, id_marker) {
        (true, Some(k), Some(u)) => Some((k, u)),
        _ => None,
    };
    Ok((out, next))
}

/// Parts of a multipart upload on the server: number → (size, ETag).
pub type Parts = HashMap<u16, (u64, String)>;

/// Read a ListParts answer: number → (size, ETag) of its parts, and the
/// next part number marker when the listing is truncated. An error when a
/// part lacks its number, size or ETag.
pub fn parts_page(body: &str) -> Result<(Parts, Option<u16>), XmlError> {
    let mut parts = HashMap::new();
    let (mut number, mut size, mut etag) = (None, None, None);
    let (mut truncated, mut next) = (false, None);
    walk(body, |n| {
        match n {
            Node::Leaf {
                parent: b"Part",
                name,
                text,
            } => match name {
                b"PartNumber" => number = text.trim().parse::<u16>().ok(),
                b"Size" => size = text.trim().parse::<u64>().ok(),
                b"ETag" => etag = Some(text.trim().to_string()),
                _ => {}
            },
            Node::End(b"Part") => {
                let bad = XmlError::Missing("a part without its number, size or ETag");
                let (Some(n), Some(s), Some(e)) = (number.take(), size.take(), etag.take()) else {
                    return Err(bad);
                };
                parts.insert(n, (s, e));
            }
            Node::Leaf { name, text, .. } => match name {
                b"IsTruncated" => truncated = text.trim() == "true",
                b"NextPartNumberMarker" => next = text.trim().parse::<u16>().ok(),
                _ => {}
            },
            _ => {}
        }
        Ok(())
    })?;
    Ok((parts, next.filter(|_| truncated)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_pages_with_odd_keys_prefixes_and_a_token() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>d/</Prefix><KeyCount>4</KeyCount><MaxKeys>4</MaxKeys>
  <Delimiter>/</Delimiter><IsTruncated>true</IsTruncated>
  <Contents>
    <Key>d/ a &amp; b &lt;c&gt; &quot;q&quot; &apos;s&apos; &#233;&#x4E2D; </Key>
    <LastModified>2024-01-02T03:04:05.250Z</LastModified>
    <ETag>&quot;0cc175b9c0f1b6a831c399e269772661&quot;</ETag>
    <Size>5</Size><StorageClass>STANDARD</StorageClass>
    <Owner><ID>x</ID><DisplayName>y</DisplayName></Owner>
  </Contents>
  <Contents><Size>0</Size><Key>d/日本語 + %20 ~/</Key></Contents>
  <Contents><Key><![CDATA[d/<raw>]]></Key><Size>7</Size></Contents>
  <CommonPrefixes><Prefix>d/sub dir/</Prefix></CommonPrefixes>
  <CommonPrefixes><Prefix>d/x&amp;y/</Prefix></CommonPrefixes>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
</ListBucketResult>"#;
        let p = list_page(body).unwrap();
        let keys: Vec<&str> = p.contents.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "d/ a & b <c> \"q\" 's' é中 ",
                "d/日本語 + %20 ~/",
                "d/<raw>"
            ]
        );
        let first = &p.contents[0];
        assert_eq!(first.size, 5);
        assert_eq!(first.last_modified, Some((1_704_164_645, 250_000_000)));
        assert_eq!(
            first.version,
            version(
                Some("\"0cc175b9c0f1b6a831c399e269772661\""),
                first.last_modified
            )
        );
        assert_ne!(first.version, 0);
        // Without an ETag or a date there is no fingerprint.
        assert_eq!((p.contents[1].size, p.contents[1].version), (0, 0));
        assert_eq!(p.common_prefixes, ["d/sub dir/", "d/x&y/"]);
        assert_eq!(
            p.next.as_deref(),
            Some("1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=")
        );
    }

    #[test]
    fn url_encoded_listings_are_decoded() {
        let body = "<ListBucketResult><EncodingType>url</EncodingType>\
<Contents><Key>d%2Fa+b%2Bc%25%C3%A9</Key><Size>1</Size></Contents>\
<Contents><Key>d%2Fplain</Key><Size>1</Size></Contents>\
<Contents><Key>d%2Fbad%FF</Key><Size>1</Size></Contents>\
<CommonPrefixes><Prefix>d%2Fsub+dir%2F</Prefix></CommonPrefixes></ListBucketResult>";
        let p = list_page(body).unwrap();
        let keys: Vec<&str> = p.contents.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(keys, ["d/a b+c%é", "d/plain", "d%2Fbad%FF"]);
        assert_eq!(p.common_prefixes, ["d/sub dir/"]);
        // Without the encoding the keys are as written.
        let p = list_page("<L><Contents><Key>a+b%2F</Key></Contents></L>").unwrap();
        assert_eq!(p.contents[0].key, "a+b%2F");
    }

    #[test]
    fn last_pages_and_empty_ones() {
        let last = "<ListBucketResult><IsTruncated>false</IsTruncated>\
<NextContinuationToken>stale</NextContinuationToken>\
<Contents><Key>k</Key><Size>1</Size></Contents></ListBucketResult>";
        let p = list_page(last).unwrap();
        assert_eq!(p.next, None, "a page that says it is the last one");
        assert_eq!(p.truncated, Some(false));
        assert_eq!(p.contents.len(), 1);
        let empty =
            list_page("<ListBucketResult><KeyCount>0</KeyCount></ListBucketResult>").unwrap();
        assert_eq!(empty, ListPage::default());
        // Self-closing elements are empty text.
        let p = list_page("<L><Contents><Key>k</Key><ETag/><Size>2</Size></Contents></L>").unwrap();
        assert_eq!(p.contents[0].size, 2);
    }

    #[test]
    fn broken_listings_are_errors() {
        for bad in [
            "<ListBucketResult><Contents><Key>k</Key></Content></ListBucketResult>",
            "<L><Contents><Size>1</Size></Contents></L>",
            "<L><Contents><Key>a &bogus; b</Key></Contents></L>",
            "<ListBucketResult><Contents><Key>k</Key><Size>1</Size></Contents>",
        ] {
            assert!(list_page(bad).is_err(), "{bad}");
        }
        let e = list_page("<L><Contents><Size>1</Size></Contents></L>").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unreadable XML answer: an object without its key"
        );
    }

    #[test]
    fn error_bodies() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchKey</Code><Message>The specified key does not exist: &quot;a&amp;b&quot;</Message><Key>a&amp;b</Key><RequestId>1</RequestId></Error>"#;
        let e = error_body(body).unwrap();
        assert_eq!(e.code, "NoSuchKey");
        assert_eq!(e.message, "The specified key does not exist: \"a&b\"");
        assert_eq!(e.key, "a&b");
        // No XML at all (a proxy's page), or nothing: no error body.
        assert_eq!(error_body("<html><body>Bad Gateway</body></html>"), None);
        assert_eq!(error_body(""), None);
        assert_eq!(error_body("upstream connect error"), None);
        // Cut short: what was read counts.
        let cut = error_body("<Error><Code>SlowDown</Code><Message>Reduce your").unwrap();
        assert_eq!((cut.code.as_str(), cut.message.as_str()), ("SlowDown", ""));
        // A copy's 200 answer is either a result or an error.
        assert_eq!(
            error_body("<CopyObjectResult><ETag>&quot;x&quot;</ETag></CopyObjectResult>"),
            None
        );
        let e = error_body("<Error><Code>InternalError</Code></Error>").unwrap();
        assert_eq!((e.code.as_str(), e.message.as_str()), ("InternalError", ""));
    }

    #[test]
    fn delete_results() {
        let ok = r#"<?xml version="1.0" encoding="UTF-8"?>
<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"></DeleteResult>"#;
        assert!(delete_errors(ok).unwrap().is_empty());
        let verbose = "<DeleteResult><Deleted><Key>a</Key></Deleted><Error><Key>b &amp; c</Key>\
<Code>AccessDenied</Code><Message>Access Denied</Message></Error>\
<Error><Key>d</Key><Code>InternalError</Code><Message>x</Message></Error></DeleteResult>";
        let errs = delete_errors(verbose).unwrap();
        assert_eq!(errs.len(), 2);
        assert_eq!(
            errs[0],
            ErrorBody {
                key: "b & c".into(),
                code: "AccessDenied".into(),
                message: "Access Denied".into()
            }
        );
        assert_eq!(errs[1].key, "d");
        assert!(delete_errors("<DeleteResult><Error>").is_err());
        assert!(delete_errors("<DeleteResult><Deleted><Key>a</Key></Deleted>").is_err());
    }

    #[test]
    fn multipart_answers() {
        let created = r#"<?xml version="1.0" encoding="UTF-8"?>
<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>b</Bucket><Key>k</Key><UploadId>VXBsb2FkIElE+/=</UploadId></InitiateMultipartUploadResult>"#;
        assert_eq!(upload_id(created).unwrap(), "VXBsb2FkIElE+/=");
        assert!(upload_id("<InitiateMultipartUploadResult/>").is_err());
        let copied = "<CopyPartResult><LastModified>2024-01-02T03:04:05.000Z</LastModified>\
<ETag>&quot;b54357faf0632cce46e942fa68356b38&quot;</ETag></CopyPartResult>";
        assert_eq!(
            copy_part_etag(copied).unwrap(),
            "\"b54357faf0632cce46e942fa68356b38\""
        );
        assert!(copy_part_etag("<CopyPartResult></CopyPartResult>").is_err());
    }

    #[test]
    fn upload_listings() {
        let page = "<ListMultipartUploadsResult><Bucket>b</Bucket><KeyMarker></KeyMarker>\
<NextKeyMarker>z &amp; z</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>\
<IsTruncated>true</IsTruncated>\
<Upload><Key>a &lt;1&gt;</Key><UploadId>u1</UploadId><Initiator><ID>i</ID></Initiator>\
<Initiated>2024-01-02T03:04:05.000Z</Initiated></Upload>\
<Upload><Key>z &amp; z</Key><UploadId>u2</UploadId></Upload>\
<Upload><Key>no id</Key></Upload></ListMultipartUploadsResult>";
        let (ups, next) = uploads_page(page).unwrap();
        assert_eq!(
            ups,
            [
                Upload {
                    key: "a <1>".into(),
                    id: "u1".into(),
                    initiated: "2024-01-02T03:04:05.000Z".into()
                },
                Upload {
                    key: "z & z".into(),
                    id: "u2".into(),
                    initiated: String::new()
                }
            ]
        );
        assert_eq!(next, Some(("z & z".into(), "u2".into())));
        let last = "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>\
<NextKeyMarker>k</NextKeyMarker><NextUploadIdMarker>u</NextUploadIdMarker></ListMultipartUploadsResult>";
        assert_eq!(uploads_page(last).unwrap(), (vec![], None));
    }

    #[test]
    fn list_parts_answers_read_whatever_their_root() {
        // moto's server: root `ListPartsResponse`, a next marker while not truncated.
        let moto = r#"<?xml version="1.0" encoding="utf-8"?>
<ListPartsResponse xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>b</Bucket><Key>k</Key><UploadId>u</UploadId><PartNumberMarker>0</PartNumberMarker><NextPartNumberMarker>1</NextPartNumberMarker><MaxParts>1000</MaxParts><IsTruncated>false</IsTruncated><Part><PartNumber>1</PartNumber><LastModified>2026-11-23T13:42:43.000Z</LastModified><ETag>"6da323ddf02915cabcfeca8b6e5eb306"</ETag><Size>6000000</Size></Part><Initiator><ID>x</ID></Initiator><StorageClass>STANDARD</StorageClass></ListPartsResponse>"#;
        let (parts, next) = parts_page(moto).unwrap();
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
        let (parts, next) = parts_page(aws).unwrap();
        assert_eq!(next, Some(2));
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[&2], (6, "\"bb\"".to_string()));
        // A part without its size: unreadable (the caller starts afresh).
        assert!(
            parts_page("<X><Part><PartNumber>1</PartNumber><ETag>a</ETag></Part></X>").is_err()
        );
        assert_eq!(parts_page("<X></X>").unwrap().0.len(), 0);
    }
}
