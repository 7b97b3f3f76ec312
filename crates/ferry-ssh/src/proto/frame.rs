//! Frames on the wire: a length and an id in front of each message; big
//! data placed straight into its buffer as it is read; the writer thread
//! that sends frames (spliced from files where it can).

use std::io::{self, Read, Write};

use serde::Serialize;

use super::{Req, Resp, CHUNK, MAX_FRAME};

/// A frame being built: length and id in front, the message after.
pub fn frame(id: u64, msg: &impl Serialize) -> Vec<u8> {
    frame_sized(id, msg, 0)
}

/// [`frame`] of a message carrying `bytes` bytes of data: the frame is
/// allocated once, at its full size.
pub fn frame_sized(id: u64, msg: &impl Serialize, bytes: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + bytes);
    b.extend_from_slice(&[0u8; 4]);
    b.extend_from_slice(&id.to_le_bytes());
    let mut b = postcard::to_extend(msg, b).expect("messages always encode");
    let len = (b.len() - 4) as u32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    b
}

/// Give a frame made by [`frame`] (a reply made before its request came)
/// the id `id`.
pub fn set_frame_id(frame: &mut [u8], id: u64) {
    frame[4..12].copy_from_slice(&id.to_le_bytes());
}

/// Read one frame: its id and its message bytes (`None` at a clean end of
/// the stream, between frames).
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(u64, Vec<u8>)>> {
    let Some((id, len)) = read_head(r)? else {
        return Ok(None);
    };
    Ok(Some((id, read_body(r, Vec::with_capacity(len), len)?)))
}

/// Read a frame's length and id: its id and the length of its message
/// bytes (`None` at a clean end of the stream, between frames).
pub fn read_head(r: &mut impl Read) -> io::Result<Option<(u64, usize)>> {
    let mut head = [0u8; 12];
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..]) {
            Ok(0) if n == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    if !(8..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad frame length {len}"),
        ));
    }
    let id = u64::from_le_bytes(head[4..].try_into().expect("8 bytes"));
    Ok(Some((id, len - 8)))
}

/// The rest of a frame's `len` message bytes after those `body` holds.
pub fn read_body(r: &mut impl Read, mut body: Vec<u8>, len: usize) -> io::Result<Vec<u8>> {
    let got = body.len();
    // Read into spare capacity: a chunk's megabyte is not zeroed first.
    if r.take((len - got) as u64).read_to_end(&mut body)? < len - got {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(body)
}

/// The first byte of a frame's message bytes that were placed
/// ([`read_placed`]): no message begins with it (a variant index is below
/// 128); the next two (little-endian) say where the message begins.
pub const PLACED: u8 = 0xFF;
/// The size of the buffers [`read_placed`] reads big replies into.
pub const PLACED_BUF: usize = CHUNK + 2 * 4096 + 64;

/// [`read_frame`] for replies: a big [`Resp::Data`] (no holes) is read
/// into a buffer (`spare` gives one back, else one is made) at the place
/// where its data sits aligned in memory (4096), behind a [`PLACED`]
/// mark: written from there with `O_DIRECT`, it is not copied again.
/// [`Body::bytes`](crate::conn::Body::bytes) skips the mark.
pub fn read_placed(
    r: &mut impl Read,
    spare: impl FnOnce() -> Option<Vec<u8>>,
) -> io::Result<Option<(u64, Vec<u8>)>> {
    const ALIGN: usize = 4096;
    let Some((id, body_len)) = read_head(r)? else {
        return Ok(None);
    };
    let mut start = [0u8; 16];
    let mut got = 0;
    if (64 << 10..=PLACED_BUF - 2 * ALIGN).contains(&body_len) {
        r.read_exact(&mut start)?;
        got = start.len();
        static VARIANT: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
        let v = *VARIANT.get_or_init(|| data_parts(0, 0, None).0[12]);
        let mut k = 1;
        if start[0] == v && take_varint(&start, &mut k).is_some() {
            let mut buf = spare().unwrap_or_default();
            if buf.capacity() != PLACED_BUF {
                buf = vec![0u8; PLACED_BUF];
            } else {
                buf.resize(PLACED_BUF, 0);
            }
            // The data at an aligned address, three bytes of mark before.
            let at = buf[3 + k..].as_ptr().align_offset(ALIGN) + 3;
            buf[0] = PLACED;
            buf[1..3].copy_from_slice(&(at as u16).to_le_bytes());
            buf[at..at + got].copy_from_slice(&start);
            r.read_exact(&mut buf[at + got..at + body_len])?;
            buf.truncate(at + body_len);
            return Ok(Some((id, buf)));
        }
    }
    let mut body = Vec::with_capacity(body_len);
    body.extend_from_slice(&start[..got]);
    Ok(Some((id, read_body(r, body, body_len)?)))
}

/// Write the frames `rx` hands over to `out` until it closes or a write
/// fails, or an empty one ends the stream: as many as are queued, then one
/// flush (one end's writer thread).
pub fn write_frames(out: impl Write, rx: std::sync::mpsc::Receiver<Vec<u8>>) {
    let mut out = io::BufWriter::with_capacity(256 << 10, out);
    while let Ok(f) = rx.recv() {
        let queued = std::iter::once(f).chain(rx.try_iter());
        for f in queued {
            if f.is_empty() {
                // The end: flushed, then the stream closed (dropped).
                let _ = out.flush();
                return;
            }
            if out.write_all(&f).is_err() {
                return;
            }
        }
        if out.flush().is_err() {
            return;
        }
    }
}

/// A frame for a writer thread ([`write_out`]).
#[derive(Debug)]
pub enum Out {
    /// A whole frame.
    Frame(Vec<u8>),
    /// A frame whose content waits in a pipe (spliced there from a file):
    /// `head`, the pipe's bytes, then `tail`.
    Piped {
        /// The frame up to its content.
        head: Vec<u8>,
        /// The content.
        pipe: crate::splice::Pipe,
        /// The frame after its content.
        tail: Vec<u8>,
    },
}

impl From<Vec<u8>> for Out {
    fn from(f: Vec<u8>) -> Out {
        Out::Frame(f)
    }
}

/// A varint as postcard writes one (7 bits a byte, low bits first).
fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Put the frame length in front of frame `b`, whose content of `n`
/// bytes (not in it) goes at `at`, where `b` holds an empty content's
/// length byte (a 0): the frame's head and tail around that content.
fn split_at_content(mut b: Vec<u8>, at: usize, n: usize) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(b[at], 0, "an empty content's length");
    let tail = b.split_off(at + 1);
    b.truncate(at);
    varint(n as u64, &mut b);
    let len = (b.len() - 4 + n + tail.len()) as u32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    (b, tail)
}

/// The head of the frame (id 0) of [`Req::WriteAt`] of `n` bytes of
/// `file` at `offset`: what goes before those bytes (nothing after).
pub fn write_at_head(file: u64, offset: u64, n: usize) -> Vec<u8> {
    let b = frame(
        0,
        &Req::WriteAt {
            file,
            offset,
            data: &[],
        },
    );
    let at = b.len() - 1;
    split_at_content(b, at, n).0
}

/// A varint of postcard at `b[*i..]`, `*i` moved past it.
fn take_varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(*i)?;
        *i += 1;
        n |= u64::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

/// When `start`, a frame's first message bytes, begins a [`Req::WriteAt`]:
/// its file, its offset and where its data begins (after its length).
pub fn parse_write_at(start: &[u8]) -> Option<(u64, u64, usize)> {
    static VARIANT: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    let v = *VARIANT.get_or_init(|| write_at_head(0, 0, 0)[12]);
    if start.first() != Some(&v) {
        return None;
    }
    let mut i = 1;
    let file = take_varint(start, &mut i)?;
    let offset = take_varint(start, &mut i)?;
    take_varint(start, &mut i)?;
    Some((file, offset, i))
}

/// The head and tail of the frame of [`Resp::Data`] of `n` bytes, no
/// holes, with `current`: what goes before and after those bytes.
pub fn data_parts(id: u64, n: usize, current: Option<(u64, i64, u32)>) -> (Vec<u8>, Vec<u8>) {
    let b = frame(
        id,
        &Resp::Data {
            data: &[],
            current,
            zeros: Vec::new(),
        },
    );
    // Length, id, the variant (one byte), then the data's length.
    split_at_content(b, 4 + 8 + 1, n)
}

/// Write the frames `rx` hands over to `out` until it closes or a write
/// fails, or an empty one ends the stream: as many as are queued, then one
/// flush (one end's writer thread). A [`Out::Piped`] frame's content is
/// moved from its pipe into `out` (splice).
pub fn write_out(out: impl crate::splice::Sink, rx: std::sync::mpsc::Receiver<Out>) {
    let mut out = io::BufWriter::with_capacity(256 << 10, out);
    let put = |out: &mut io::BufWriter<_>, f: Out| -> io::Result<bool> {
        match f {
            Out::Frame(f) if f.is_empty() => Ok(false),
            Out::Frame(f) => out.write_all(&f).map(|()| true),
            Out::Piped {
                head,
                mut pipe,
                tail,
            } => {
                out.write_all(&head)?;
                out.flush()?;
                crate::splice::Sink::take(out.get_mut(), &mut pipe)?;
                out.write_all(&tail).map(|()| true)
            }
        }
    };
    while let Ok(f) = rx.recv() {
        let queued = std::iter::once(f).chain(rx.try_iter());
        for f in queued {
            match put(&mut out, f) {
                Ok(true) => {}
                Ok(false) => {
                    // The end: flushed, then the stream closed (dropped).
                    let _ = out.flush();
                    return;
                }
                Err(_) => return,
            }
        }
        if out.flush().is_err() {
            return;
        }
    }
}
