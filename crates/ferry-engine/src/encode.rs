//! How names are written in output: one place for every command, so that a
//! name can never forge a line of text output and `--json` loses no byte.
//!
//! **Text** ([`text_name`]): bytes are written as they are, except
//! - `\` → `\\`, newline → `\n`, tab → `\t`, carriage return → `\r`;
//! - every other control byte (0x00–0x1f, 0x7f) and every byte of a sequence
//!   that is not valid UTF-8 → `\xHH` (two lower-case hex digits);
//! - the C1 controls (U+0080–U+009F), the line and paragraph separators
//!   (U+2028, U+2029) and the bidirectional formatting characters
//!   (U+202A–U+202E, U+2066–U+2069) → `\xHH` for each of their UTF-8 bytes
//!   (a name can neither move the cursor nor reorder a line on a terminal);
//! - `>` right after ` -` → `\x3e`, and `<` between a space and `-` →
//!   `\x3c`, so that ` -> ` and ` <- ` on a line are always separators
//!   ferry wrote (`ls`'s `PATH -> TARGET`, bisync's `NEW <- OLD`).
//!
//! Other valid UTF-8 is written as is. Decoding is the same for every byte:
//! `\\`, `\n`, `\t`, `\r`, `\xHH` stand for one byte; any other byte stands
//! for itself ([`text_unescape`]).
//!
//! **JSON** ([`json_name`]): a name that is valid UTF-8 is a JSON string. A
//! name that is not gets its field twice: `"KEY"` holds a display string
//! (each invalid byte as U+FFFD), and `"KEY_bytes"` the exact bytes in
//! base64 (standard alphabet, padded), e.g.
//! `"path":"a\ufffd","path_bytes":"Yf8="` for `a\xff`.

/// Is `b` written as itself in text output (ignoring the arrow rule)?
#[inline]
fn plain_ascii(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'\\'
}

/// Append `name` to `out`, escaped for text output (see the module docs).
pub fn text_name(out: &mut Vec<u8>, name: &[u8]) {
    // The common case: printable ASCII, no backslash, no arrow.
    if name.iter().all(|&b| plain_ascii(b)) && !has_arrow(name) {
        out.extend_from_slice(name);
        return;
    }
    out.reserve(name.len() + 8);
    for chunk in name.utf8_chunks() {
        let v = chunk.valid().as_bytes();
        let mut i = 0;
        while i < v.len() {
            let b = v[i];
            if b < 0x80 {
                match b {
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'>' if i >= 2 && &v[i - 2..i] == b" -" => hex(out, b),
                    b'<' if i >= 1 && v[i - 1] == b' ' && v.get(i + 1) == Some(&b'-') => {
                        hex(out, b)
                    }
                    _ if plain_ascii(b) => out.push(b),
                    _ => hex(out, b),
                }
                i += 1;
                continue;
            }
            // A valid multi-byte character: its length from the lead byte.
            let len = match b {
                0xc0..=0xdf => 2,
                0xe0..=0xef => 3,
                _ => 4,
            };
            let ch = &v[i..i + len];
            let hidden = match ch {
                [0xc2, 0x80..=0x9f] => true, // C1 controls
                [0xe2, 0x80, 0xa8..=0xae] | [0xe2, 0x81, 0xa6..=0xa9] => true, // separators, bidi
                _ => false,
            };
            if hidden {
                ch.iter().for_each(|&c| hex(out, c));
            } else {
                out.extend_from_slice(ch);
            }
            i += len;
        }
        for &b in chunk.invalid() {
            hex(out, b);
        }
    }
}

/// `name` escaped for text output, as a `String` (for `format!`).
pub fn text_name_string(name: &[u8]) -> String {
    let mut v = Vec::with_capacity(name.len());
    text_name(&mut v, name);
    String::from_utf8(v).expect("escaped text is UTF-8")
}

/// Does `name` hold ` ->` or ` <-` (which [`text_name`] breaks up)?
#[inline]
fn has_arrow(name: &[u8]) -> bool {
    name.windows(3).any(|w| w == b" ->" || w == b" <-")
}

#[inline]
fn hex(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(&[
        b'\\',
        b'x',
        HEX[usize::from(b >> 4)],
        HEX[usize::from(b & 15)],
    ]);
}

/// Decode text output written by [`text_name`] back to the exact bytes.
/// `None` for a malformed escape.
pub fn text_unescape(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' {
            out.push(s[i]);
            i += 1;
            continue;
        }
        match s.get(i + 1)? {
            b'\\' => out.push(b'\\'),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'x' => {
                let h = std::str::from_utf8(s.get(i + 2..i + 4)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            _ => return None,
        }
        i += 2;
    }
    Some(out)
}

/// Append `s` as a JSON string (serde_json's escaping).
#[inline]
pub fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Append `"KEY":NAME` for a name: a JSON string when `name` is UTF-8,
/// else a display string plus `"KEY_bytes":"BASE64"` with the exact bytes.
pub fn json_name(out: &mut Vec<u8>, key: &str, name: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    match std::str::from_utf8(name) {
        Ok(s) => json_string(out, s),
        Err(_) => {
            json_string(out, &String::from_utf8_lossy(name));
            out.extend_from_slice(b",\"");
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"_bytes\":\"");
            base64(out, name);
            out.push(b'"');
        }
    }
}

/// Append `data` in base64 (RFC 4648 standard alphabet, with padding).
pub fn base64(out: &mut Vec<u8>, data: &[u8]) {
    use base64::Engine as _;
    let mut s = String::new();
    base64::prelude::BASE64_STANDARD.encode_string(data, &mut s);
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn esc(b: &[u8]) -> String {
        text_name_string(b)
    }

    #[test]
    fn examples() {
        assert_eq!(esc(b"plain name.txt"), "plain name.txt");
        assert_eq!(esc("ünï 日本".as_bytes()), "ünï 日本");
        assert_eq!(
            esc(b"evil\nferry: other: Permission denied"),
            "evil\\nferry: other: Permission denied"
        );
        assert_eq!(esc(b"a\\nb"), "a\\\\nb");
        assert_eq!(
            esc(b"t\tr\r\x01\x1b[31m\x7f"),
            "t\\tr\\r\\x01\\x1b[31m\\x7f"
        );
        assert_eq!(esc(b"a\xff\xfe"), "a\\xff\\xfe");
        assert_eq!(esc(b"caf\xc3"), "caf\\xc3");
        assert_eq!(esc("c1\u{85}".as_bytes()), "c1\\xc2\\x85");
        assert_eq!(esc("rlo\u{202e}x".as_bytes()), "rlo\\xe2\\x80\\xaex");
        assert_eq!(esc(b"a -> b"), "a -\\x3e b");
        assert_eq!(esc(b"a ->"), "a -\\x3e");
        assert_eq!(esc(b"new <- old"), "new \\x3c- old");
        assert_eq!(esc(b"a->b <x -"), "a->b <x -");
    }

    #[test]
    fn base64_vectors() {
        for (i, o) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"\xff\xfe\xfd", "//79"),
        ] {
            let mut v = Vec::new();
            base64(&mut v, i);
            assert_eq!(v, o.as_bytes());
        }
    }

    #[test]
    fn json_names() {
        let j = |b: &[u8]| {
            let mut v = Vec::new();
            json_name(&mut v, "path", b);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(j(b"a\"b\n"), r#""path":"a\"b\n""#);
        assert_eq!(j(b"a\xff"), r#""path":"a�","path_bytes":"Yf8=""#);
        assert_ne!(j(b"a\xff"), j(b"a\xfe"));
    }

    proptest! {
        #[test]
        fn text_round_trips_and_stays_on_one_line(name in proptest::collection::vec(any::<u8>(), 0..40)) {
            let e = esc(&name);
            prop_assert!(!e.bytes().any(|b| b < 0x20 || b == 0x7f), "{e:?}");
            prop_assert!(!e.contains(" -> ") && !e.contains(" <- ") && !e.ends_with(" ->"), "{e:?}");
            prop_assert_eq!(text_unescape(e.as_bytes()), Some(name));
        }

        #[test]
        fn arrow_separators_are_unambiguous(a in "[ <>a-]{0,8}", b in "[ <>a-]{0,8}") {
            // The first ` -> ` of `A -> B` is the separator, whatever A and B hold.
            let line = format!("{} -> {}", esc(a.as_bytes()), esc(b.as_bytes()));
            let (x, y) = line.split_once(" -> ").unwrap();
            prop_assert_eq!(text_unescape(x.as_bytes()).unwrap(), a.as_bytes());
            prop_assert_eq!(text_unescape(y.as_bytes()).unwrap(), b.as_bytes());
            let line = format!("{} <- {}", esc(a.as_bytes()), esc(b.as_bytes()));
            let (x, y) = line.split_once(" <- ").unwrap();
            prop_assert_eq!(text_unescape(x.as_bytes()).unwrap(), a.as_bytes());
            prop_assert_eq!(text_unescape(y.as_bytes()).unwrap(), b.as_bytes());
        }
    }
}
