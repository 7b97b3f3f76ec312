//! One ranged reader for every backend: what a
//! [`RangedSource`] does around the backend's requests, written once.
//!
//! A backend implements [`Fetch`]: its content's identity, and "fetch
//! `[a, b)` into this [`Sink`]" (one request streamed, or a [`pipelined`]
//! window of requests over one connection). Every `Fetch` is a
//! `RangedSource` through the blanket impl here, which owns the rest:
//! pieces handed over in order and never past the range (the sink keeps
//! the offset, a backend only hands bytes), at most [`RANGE_PIECE`] each,
//! paced by the [`Limiter`]; a range that comes back short is a changed
//! file; a broken fetch is resumed from the last byte handed over when
//! the backend says so ([`Fetch::again`]), and never after the writer
//! itself failed. The sequential readers share [`Window`] (requests in
//! flight, in order) and [`give`] (hand out a held reply).
//!
//! The hot path stays static: `Fetch` is generic, the one dynamic call per
//! piece is the writer's `out`, as before.

use std::collections::VecDeque;
use std::io;

use crate::bwlimit::Limiter;
use crate::store::{RangedSource, RANGE_PIECE};

/// A backend's part of a [`RangedSource`]: the content's identity and one
/// attempt at a range. Everything else is the blanket impl's.
pub trait Fetch: Sync {
    /// Size and an identity of the current content (see
    /// [`RangedSource::identity`]).
    fn identity(&self) -> io::Result<(u64, String)>;

    /// Fetch `[sink.at(), sink.end())` of the content `identity` names,
    /// handing the bytes to `sink` in order. An error if the content
    /// changed ([`changed`]); a fetch that returns `Ok` before the end is
    /// taken for a file that shrank. After an error, what the sink holds
    /// was handed over and [`again`](Fetch::again) decides.
    fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()>;

    /// Attempt `attempt` (from 1) failed with `e`: `Ok(())` to fetch the
    /// rest of the range again (after whatever pause the backend keeps),
    /// or the error to give up with. Not asked when the writer failed.
    fn again(&self, e: io::Error, attempt: u32) -> io::Result<()>;
}

impl<F: Fetch> RangedSource for F {
    fn identity(&self) -> io::Result<(u64, String)> {
        Fetch::identity(self)
    }

    fn read_range(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
        limit: Option<&Limiter>,
    ) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut sink = Sink {
            at: offset,
            end: offset + len,
            out,
            limit,
            refused: false,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.fetch(&mut sink) {
                Ok(()) if sink.at == sink.end => return Ok(()),
                Ok(()) => return Err(changed()),
                Err(e) if sink.refused => return Err(e),
                Err(e) => self.again(e, attempt)?,
            }
        }
    }
}

/// The error of a file that changed while it was read: replaced, grown
/// past, or cut short of, what was opened.
pub fn changed() -> io::Error {
    io::Error::other("the file changed while it was copied")
}

/// Where a [`Fetch`] hands its bytes: the writer of a range, which knows
/// the offset of the next byte, so pieces can only come in order.
pub struct Sink<'a> {
    at: u64,
    end: u64,
    out: &'a mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
    limit: Option<&'a Limiter>,
    /// The writer failed: its error is not the connection's, no retry.
    refused: bool,
}

impl Sink<'_> {
    /// The offset of the next byte to hand over.
    pub fn at(&self) -> u64 {
        self.at
    }

    /// The end of the range.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The most to gather for one hand-over: a [`RANGE_PIECE`], or the
    /// limiter's chunk.
    pub fn piece_max(&self) -> usize {
        self.limit
            .map_or(RANGE_PIECE, |l| l.chunk().min(RANGE_PIECE))
    }

    /// Hand over `data`, the bytes at [`at`](Sink::at), in pieces of at
    /// most [`RANGE_PIECE`], each paced by the limiter first. Bytes past
    /// the end of the range are an error, none of them handed over.
    pub fn put(&mut self, data: &[u8]) -> io::Result<()> {
        if data.len() as u64 > self.end - self.at {
            return Err(io::Error::other("longer than the range asked"));
        }
        for piece in data.chunks(RANGE_PIECE) {
            if let Some(l) = self.limit {
                l.acquire(piece.len() as u64);
            }
            if let Err(e) = (self.out)(self.at, piece) {
                self.refused = true;
                return Err(e);
            }
            self.at += piece.len() as u64;
        }
        Ok(())
    }
}

/// Requests in flight over `[next, end)`, oldest first: at most `depth`,
/// each of at most `chunk` bytes.
pub struct Window<T> {
    ahead: VecDeque<(u64, u32, T)>,
    next: u64,
    end: u64,
    depth: usize,
    chunk: u32,
}

impl<T> Window<T> {
    /// No request yet; the first will be for `at`.
    pub fn new(at: u64, end: u64, depth: usize, chunk: u32) -> Window<T> {
        Window {
            ahead: VecDeque::with_capacity(depth),
            next: at,
            end,
            depth,
            chunk,
        }
    }

    /// Ask (`ask(offset, len)`) for the next chunk, if any is left: whether
    /// one was asked.
    pub fn ask_next(&mut self, ask: impl FnOnce(u64, u32) -> io::Result<T>) -> io::Result<bool> {
        if self.next >= self.end {
            return Ok(false);
        }
        let n = (self.end - self.next).min(u64::from(self.chunk)) as u32;
        let t = ask(self.next, n)?;
        self.push(self.next, n, t);
        Ok(true)
    }

    /// Ask for chunks until `depth` are in flight or none is left.
    pub fn fill(&mut self, mut ask: impl FnMut(u64, u32) -> io::Result<T>) -> io::Result<()> {
        while self.ahead.len() < self.depth && self.ask_next(&mut ask)? {}
        Ok(())
    }

    /// A request for `[at, at + len)` started elsewhere, the next in order.
    pub fn push(&mut self, at: u64, len: u32, t: T) {
        self.ahead.push_back((at, len, t));
        self.next = at + u64::from(len);
    }

    /// The rest of a reply that came short, asked again: it comes first.
    pub fn again(&mut self, at: u64, len: u32, t: T) {
        self.ahead.push_front((at, len, t));
    }

    /// The oldest request in flight: offset, length, ticket.
    pub fn pop(&mut self) -> Option<(u64, u32, T)> {
        self.ahead.pop_front()
    }

    /// Where requests stop.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Requests stop at `end` (the size learnt after the first request).
    pub fn set_end(&mut self, end: u64) {
        self.end = end;
    }

    /// The end of the file is reached: the requests in flight past it are
    /// dropped (their replies come back empty) and none is asked again.
    pub fn stop(&mut self) {
        self.ahead.clear();
        self.end = self.next;
    }

    /// Nothing in flight and nothing left to ask.
    pub fn is_done(&self) -> bool {
        self.ahead.is_empty() && self.next >= self.end
    }
}

/// One attempt at `[sink.at(), sink.end())` as a window of requests over
/// one connection: `depth` in flight of up to `chunk` bytes, asked by
/// `ask(offset, len)`; `check` (the content is still the one opened) runs
/// once the first requests are out, before any byte is handed over;
/// `take` waits for a request's reply and hands its bytes to the sink. A
/// reply shorter than asked has its rest asked again, first; an empty one
/// is the file's end before the range's: [`changed`].
pub fn pipelined<T>(
    sink: &mut Sink<'_>,
    depth: usize,
    chunk: u32,
    mut ask: impl FnMut(u64, u32) -> io::Result<T>,
    check: impl FnOnce() -> io::Result<()>,
    mut take: impl FnMut(T, u32, &mut Sink<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let mut w = Window::new(sink.at(), sink.end(), depth, chunk);
    w.fill(&mut ask)?;
    check()?;
    while let Some((at, len, t)) = w.pop() {
        debug_assert_eq!(at, sink.at(), "replies in order");
        take(t, len, sink)?;
        let n = sink.at() - at;
        if n == 0 {
            return Err(changed());
        }
        if n < u64::from(len) {
            let rest = len - n as u32;
            let t = ask(at + n, rest)?;
            w.again(at + n, rest, t);
        }
        w.fill(&mut ask)?;
    }
    Ok(())
}

/// Hand out what is left of a held reply, `body[span.0..span.1]`, into
/// `buf`: how many bytes, `None` when nothing is left (ask for more).
pub fn give(body: &[u8], span: &mut (usize, usize), buf: &mut [u8]) -> Option<usize> {
    let (a, b) = *span;
    if a >= b {
        return None;
    }
    let n = (b - a).min(buf.len());
    buf[..n].copy_from_slice(&body[a..a + n]);
    span.0 += n;
    Some(n)
}

#[cfg(test)]
mod tests;
