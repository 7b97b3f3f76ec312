//! The coalescing write path: small writes are gathered into full buffers, large writes pass straight
//! through, and when a large write arrives with data already buffered both
//! go out in one `writev`. Every write syscall but the last carries at least
//! a full buffer, so the count is within one of `bytes / capacity` (the
//! minimum), where a plain `BufWriter` flushes partly filled buffers and then
//! issues the large write separately.

use std::io::{self, IoSlice, Write};

/// Default buffer: 256 KiB (small buffers make many small syscalls).
pub const DEFAULT_CAPACITY: usize = 256 * 1024;

/// A writer that coalesces small writes and passes large ones through.
#[derive(Debug)]
pub struct Coalescer<W: Write> {
    inner: W,
    buf: Vec<u8>,
    cap: usize,
}

impl<W: Write> Coalescer<W> {
    /// Wrap `inner` with a buffer of `cap` bytes.
    pub fn with_capacity(cap: usize, inner: W) -> Coalescer<W> {
        Coalescer {
            inner,
            buf: Vec::with_capacity(cap.max(1)),
            cap: cap.max(1),
        }
    }

    /// Wrap `inner` with the default buffer.
    pub fn new(inner: W) -> Coalescer<W> {
        Coalescer::with_capacity(DEFAULT_CAPACITY, inner)
    }

    /// The wrapped writer (flush first).
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// Flush and return the wrapped writer. (There is deliberately no
    /// flush on drop, where an error could only be swallowed: callers flush.)
    pub fn into_inner(mut self) -> io::Result<W> {
        self.flush_buf()?;
        Ok(self.inner)
    }

    fn flush_buf(&mut self) -> io::Result<()> {
        let mut off = 0;
        while off < self.buf.len() {
            match self.inner.write(&self.buf[off..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.buf.drain(..off);
                    return Err(e);
                }
            }
        }
        self.buf.clear();
        Ok(())
    }

    /// Write the buffer and `data` in one gather call (retrying short writes).
    fn write_both(&mut self, data: &[u8]) -> io::Result<()> {
        let total = self.buf.len() + data.len();
        let mut done = 0;
        while done < total {
            let r = if done < self.buf.len() {
                self.inner
                    .write_vectored(&[IoSlice::new(&self.buf[done..]), IoSlice::new(data)])
            } else {
                self.inner.write(&data[done - self.buf.len()..])
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.buf.clear();
        Ok(())
    }
}

impl<W: Write> Write for Coalescer<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = self.cap - self.buf.len();
        if data.len() < room {
            self.buf.extend_from_slice(data);
            return Ok(data.len());
        }
        if data.len() >= self.cap {
            // Large: straight through, together with anything buffered.
            if self.buf.is_empty() {
                self.inner.write_all(data)?;
            } else {
                self.write_both(data)?;
            }
            return Ok(data.len());
        }
        // Small but overflowing: top the buffer up to exactly `cap`, send it,
        // keep the rest.
        self.buf.extend_from_slice(&data[..room]);
        self.flush_buf()?;
        self.buf.extend_from_slice(&data[room..]);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_buf()?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Records each write call's size.
    #[derive(Default)]
    struct Rec {
        data: Vec<u8>,
        calls: Vec<usize>,
    }

    impl Write for Rec {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.data.extend_from_slice(b);
            self.calls.push(b.len());
            Ok(b.len())
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let n: usize = bufs.iter().map(|b| b.len()).sum();
            for b in bufs {
                self.data.extend_from_slice(b);
            }
            self.calls.push(n);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    proptest! {
        #[test]
        fn bytes_in_order_and_calls_minimal(sizes in proptest::collection::vec(0usize..3000, 0..200), cap in 1usize..2048) {
            let mut w = Coalescer::with_capacity(cap, Rec::default());
            let mut want = Vec::new();
            for (i, s) in sizes.iter().enumerate() {
                let chunk: Vec<u8> = (0..*s).map(|k| (i * 31 + k) as u8).collect();
                w.write_all(&chunk).unwrap();
                want.extend_from_slice(&chunk);
            }
            let rec = w.into_inner().unwrap();
            prop_assert_eq!(&rec.data, &want);
            // Every call but the last carries at least a full buffer.
            if let Some((_, rest)) = rec.calls.split_last() {
                for c in rest { prop_assert!(*c >= cap, "call of {} < cap {}", c, cap); }
            }
            prop_assert!(rec.calls.len() <= want.len() / cap + 1);
        }
    }

    #[test]
    fn svn_pattern_is_near_minimal() {
        let mut w = Coalescer::new(Rec::default());
        let big = vec![7u8; 86_000];
        for _ in 0..1000 {
            w.write_all(&[1; 9]).unwrap();
            w.write_all(&[2; 5]).unwrap();
            w.write_all(&big).unwrap();
        }
        let rec = w.into_inner().unwrap();
        let total = 1000 * 86_014;
        assert_eq!(rec.data.len(), total);
        assert!(rec.calls.len() <= total / DEFAULT_CAPACITY + 1);
    }
}
