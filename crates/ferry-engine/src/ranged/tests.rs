//! The shared ranged reader against fake backends that break, change and
//! come short at chosen offsets.

use super::*;
use parking_lot::Mutex;
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn content(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A backend streaming one request per attempt, in pieces of the given
/// sizes (cycled), whose connection breaks once at each offset of
/// `breaks`, and whose content changes (a new version) at `change`.
struct Stream {
    data: Vec<u8>,
    pieces: Vec<usize>,
    breaks: Mutex<Vec<u64>>,
    change: Option<u64>,
    /// Where each attempt started, and the bytes sent in all.
    starts: Mutex<Vec<u64>>,
    sent: AtomicUsize,
    attempts: u32,
}

fn stream(data: Vec<u8>, pieces: Vec<usize>, breaks: Vec<u64>) -> Stream {
    Stream {
        data,
        pieces,
        breaks: Mutex::new(breaks),
        change: None,
        starts: Mutex::new(Vec::new()),
        sent: AtomicUsize::new(0),
        attempts: u32::MAX,
    }
}

fn reset() -> io::Error {
    io::ErrorKind::ConnectionReset.into()
}

impl Fetch for Stream {
    fn identity(&self) -> io::Result<(u64, String)> {
        Ok((self.data.len() as u64, "v1".into()))
    }

    fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()> {
        self.starts.lock().push(sink.at());
        // The version check a server makes (S3's If-Match) or the stat a
        // shell backend makes: before any byte of a changed file.
        if self.change.is_some_and(|c| sink.at() >= c) {
            return Err(changed());
        }
        let mut k = 0;
        while sink.at() < sink.end() {
            let at = sink.at();
            let mut n = self.pieces[k % self.pieces.len()].max(1) as u64;
            k += 1;
            let mut stop = None;
            {
                let mut breaks = self.breaks.lock();
                if let Some(i) = breaks.iter().position(|&b| b >= at && b < at + n) {
                    let b = breaks.remove(i);
                    n = b - at;
                    stop = Some(reset());
                }
            }
            if let Some(c) = self.change {
                if c >= at && c < at + n {
                    n = c - at;
                    stop = Some(changed());
                }
            }
            let n = n.min(sink.end() - at) as usize;
            if n > 0 {
                let at = at as usize;
                sink.put(&self.data[at..at + n])?;
                self.sent.fetch_add(n, Ordering::Relaxed);
            }
            if let Some(e) = stop {
                return Err(e);
            }
        }
        Ok(())
    }

    fn again(&self, e: io::Error, attempt: u32) -> io::Result<()> {
        if e.kind() == io::ErrorKind::ConnectionReset && attempt < self.attempts {
            Ok(())
        } else {
            Err(e)
        }
    }
}

/// Read `[off, off + len)` of `src`: the pieces as handed over, and the
/// result.
fn read(src: &dyn RangedSource, off: u64, len: u64) -> (Vec<(u64, Vec<u8>)>, io::Result<()>) {
    let mut got = Vec::new();
    let res = src.read_range(
        off,
        len,
        &mut |at, b| {
            got.push((at, b.to_vec()));
            Ok(())
        },
        None,
    );
    (got, res)
}

/// The pieces follow each other from `off` and are at most a
/// `RANGE_PIECE`: their bytes, joined.
fn joined(pieces: &[(u64, Vec<u8>)], off: u64) -> Vec<u8> {
    let mut at = off;
    let mut all = Vec::new();
    for (o, b) in pieces {
        assert_eq!(*o, at, "pieces in order, no gap, no overlap");
        assert!(!b.is_empty() && b.len() <= RANGE_PIECE, "{}", b.len());
        at += b.len() as u64;
        all.extend_from_slice(b);
    }
    all
}

#[test]
fn broken_connections_resume_from_the_last_byte_handed_over() {
    let data = content(3 * RANGE_PIECE + 77, 7);
    let src = stream(
        data.clone(),
        vec![RANGE_PIECE + 5, 1000, 1],
        vec![10, 1_500_000, 1_500_001],
    );
    let (got, res) = read(&src, 3, data.len() as u64 - 3);
    res.unwrap();
    assert_eq!(joined(&got, 3), &data[3..]);
    // Each attempt after the first started at the byte where one broke.
    assert_eq!(*src.starts.lock(), [3, 10, 1_500_000, 1_500_001]);
    assert_eq!(src.sent.load(Ordering::Relaxed), data.len() - 3);
}

#[test]
fn too_many_breaks_fail_with_the_backends_error() {
    let data = content(10_000, 3);
    let mut src = stream(data.clone(), vec![100], vec![500, 600, 700]);
    src.attempts = 3;
    let (got, res) = read(&src, 0, 10_000);
    assert_eq!(res.unwrap_err().kind(), io::ErrorKind::ConnectionReset);
    assert_eq!(joined(&got, 0), &data[..700]);
}

#[test]
fn a_changed_identity_mid_range_is_an_error_and_nothing_after_it_is_handed_over() {
    let data = content(50_000, 5);
    let mut src = stream(data.clone(), vec![4096], vec![20_000]);
    src.change = Some(30_000);
    let (got, res) = read(&src, 100, 49_000);
    let e = res.unwrap_err();
    assert_eq!(e.to_string(), changed().to_string());
    assert_eq!(joined(&got, 100), &data[100..30_000]);
}

#[test]
fn a_writer_error_is_returned_and_never_retried() {
    let data = content(10_000, 9);
    let src = stream(data, vec![1000], vec![]);
    let mut calls = 0;
    let res = src.read_range(
        0,
        10_000,
        &mut |at, _| {
            calls += 1;
            if at >= 3000 {
                Err(io::Error::from(io::ErrorKind::StorageFull))
            } else {
                Ok(())
            }
        },
        None,
    );
    assert_eq!(res.unwrap_err().kind(), io::ErrorKind::StorageFull);
    assert_eq!(calls, 4);
    assert_eq!(src.starts.lock().len(), 1);
}

/// A backend whose content is shorter than the range (the file shrank).
struct Short(Vec<u8>);

impl Fetch for Short {
    fn identity(&self) -> io::Result<(u64, String)> {
        Ok((self.0.len() as u64, String::new()))
    }
    fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()> {
        let a = sink.at() as usize;
        let b = (sink.end() as usize).min(self.0.len());
        sink.put(&self.0[a.min(b)..b])
    }
    fn again(&self, e: io::Error, _: u32) -> io::Result<()> {
        Err(e)
    }
}

#[test]
fn a_range_that_comes_back_short_is_a_changed_file() {
    let (got, res) = read(&Short(content(1000, 1)), 0, 2000);
    assert_eq!(res.unwrap_err().to_string(), changed().to_string());
    assert_eq!(joined(&got, 0).len(), 1000);
    // Bytes past the range asked are refused, none handed over.
    struct Long;
    impl Fetch for Long {
        fn identity(&self) -> io::Result<(u64, String)> {
            Ok((10, String::new()))
        }
        fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()> {
            sink.put(&[0; 11])
        }
        fn again(&self, e: io::Error, _: u32) -> io::Result<()> {
            Err(e)
        }
    }
    let (got, res) = read(&Long, 0, 10);
    assert!(res.is_err() && got.is_empty());
    // An empty range asks nothing.
    assert!(read(&Long, 5, 0).1.is_ok());
}

/// A backend of pipelined requests (SSH, SFTP): replies capped at `cap`
/// bytes (short replies), the file cut at `eof` (it shrank).
struct Piped {
    data: Vec<u8>,
    cap: u32,
    eof: usize,
    depth: usize,
    chunk: u32,
    asked: Mutex<Vec<(u64, u32)>>,
    checked: AtomicUsize,
    stale: bool,
}

impl Fetch for Piped {
    fn identity(&self) -> io::Result<(u64, String)> {
        Ok((self.data.len() as u64, String::new()))
    }
    fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()> {
        pipelined(
            sink,
            self.depth,
            self.chunk,
            |at, len| {
                self.asked.lock().push((at, len));
                Ok((at, len))
            },
            || {
                // Every first request is out before the check.
                assert!(!self.asked.lock().is_empty());
                self.checked.fetch_add(1, Ordering::Relaxed);
                if self.stale {
                    Err(changed())
                } else {
                    Ok(())
                }
            },
            |(at, len), asked, sink| {
                assert_eq!(len, asked);
                let a = (at as usize).min(self.eof);
                let b = (a + len.min(self.cap) as usize).min(self.eof);
                sink.put(&self.data[a..b])
            },
        )
    }
    fn again(&self, e: io::Error, _: u32) -> io::Result<()> {
        Err(e)
    }
}

fn piped(data: Vec<u8>, cap: u32, depth: usize, chunk: u32) -> Piped {
    Piped {
        eof: data.len(),
        data,
        cap,
        depth,
        chunk,
        asked: Mutex::new(Vec::new()),
        checked: AtomicUsize::new(0),
        stale: false,
    }
}

#[test]
fn pipelined_replies_that_come_short_have_their_rest_asked_first() {
    let data = content(100_000, 11);
    let src = piped(data.clone(), 3000, 4, 4096);
    let (got, res) = read(&src, 5, 99_000);
    res.unwrap();
    assert_eq!(joined(&got, 5), &data[5..99_005]);
    let asked = src.asked.lock();
    // The window: four chunks out at first, then the first one's rest.
    assert_eq!(
        asked[..5],
        [
            (5, 4096),
            (4101, 4096),
            (8197, 4096),
            (12293, 4096),
            (3005, 1096)
        ]
    );
    assert_eq!(src.checked.load(Ordering::Relaxed), 1);
}

#[test]
fn pipelined_reads_of_a_file_that_shrank_or_was_replaced_fail() {
    let data = content(50_000, 13);
    let mut src = piped(data.clone(), u32::MAX, 8, 1000);
    src.eof = 20_500;
    let (got, res) = read(&src, 0, 50_000);
    assert_eq!(res.unwrap_err().to_string(), changed().to_string());
    assert_eq!(joined(&got, 0), &data[..20_500]);
    src.eof = data.len();
    src.stale = true;
    let (got, res) = read(&src, 0, 50_000);
    assert!(
        res.is_err() && got.is_empty(),
        "nothing handed over before the check"
    );
}

#[test]
fn pieces_are_paced_by_the_limiter() {
    let data = content(3 * RANGE_PIECE, 17);
    let src = stream(data.clone(), vec![2 * RANGE_PIECE + 1], vec![]);
    let limit = Limiter::new(1 << 40);
    let mut all = Vec::new();
    src.read_range(
        0,
        data.len() as u64,
        &mut |_, b| {
            assert!(b.len() <= RANGE_PIECE);
            all.extend_from_slice(b);
            Ok(())
        },
        Some(&limit),
    )
    .unwrap();
    assert_eq!(all, data);
    assert_eq!(limit.granted(), data.len() as u64);
}

#[test]
fn a_window_stops_at_the_end_of_the_file() {
    let mut w: Window<u64> = Window::new(0, u64::MAX, 3, 10);
    w.fill(|at, _| Ok(at)).unwrap();
    assert_eq!(w.pop(), Some((0, 10, 0)));
    w.stop();
    assert!(w.is_done());
    w.fill(|_, _| panic!("nothing asked past the end")).unwrap();
    let mut span = (2, 5);
    let mut buf = [0u8; 2];
    assert_eq!(give(b"abcdef", &mut span, &mut buf), Some(2));
    assert_eq!(&buf, b"cd");
    assert_eq!(give(b"abcdef", &mut span, &mut buf), Some(1));
    assert_eq!(give(b"abcdef", &mut span, &mut buf), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the size, the range, the piece sizes and where the
    /// connection breaks: the bytes handed over are exactly the file's,
    /// in order, each break resumed from the last byte handed over (no
    /// byte fetched twice).
    #[test]
    fn any_breaks_and_pieces_hand_over_exactly_the_file(
        size in 1usize..(2 * RANGE_PIECE + 300),
        from in 0.0f64..1.0,
        upto in 0.0f64..1.0,
        pieces in prop::collection::vec(1usize..(RANGE_PIECE + 4096), 1..5),
        breaks in prop::collection::vec(0.0f64..1.0, 0..6),
        seed in any::<u32>(),
    ) {
        let data = content(size, seed);
        let off = (from * size as f64) as u64;
        let len = ((upto * (size as u64 - off) as f64) as u64).max(1).min(size as u64 - off);
        let mut at: Vec<u64> = breaks.iter().map(|f| off + (f * len as f64) as u64).collect();
        at.sort_unstable();
        at.dedup();
        let src = stream(data.clone(), pieces, at.clone());
        let (got, res) = read(&src, off, len);
        prop_assert!(res.is_ok(), "{:?}", res);
        prop_assert_eq!(joined(&got, off), &data[off as usize..(off + len) as usize]);
        prop_assert_eq!(src.sent.load(Ordering::Relaxed) as u64, len);
        let starts = src.starts.lock().clone();
        prop_assert_eq!(starts[0], off);
        prop_assert_eq!(&starts[1..], &at[..starts.len() - 1]);
    }

    /// A content that changes at any offset: an error, and what was
    /// handed over is the file's bytes up to the change, in order.
    #[test]
    fn a_change_anywhere_is_an_error_after_exactly_the_bytes_before_it(
        size in 1usize..300_000,
        change in 0.0f64..1.0,
        piece in 1usize..70_000,
        brk in 0.0f64..1.0,
        seed in any::<u32>(),
    ) {
        let data = content(size, seed);
        let c = (change * size as f64) as u64;
        let mut src = stream(data.clone(), vec![piece], vec![(brk * size as f64) as u64]);
        src.change = Some(c);
        let (got, res) = read(&src, 0, size as u64);
        prop_assert!(res.is_err());
        prop_assert_eq!(joined(&got, 0), &data[..c as usize]);
    }

    /// Pipelined requests with replies capped anywhere: exactly the
    /// range, in order.
    #[test]
    fn pipelined_windows_hand_over_exactly_the_range(
        size in 1usize..200_000,
        from in 0.0f64..1.0,
        cap in 1u32..70_000,
        chunk in 1u32..70_000,
        depth in 1usize..10,
        seed in any::<u32>(),
    ) {
        let data = content(size, seed);
        let off = (from * size as f64) as u64;
        let len = size as u64 - off;
        let src = piped(data.clone(), cap, depth, chunk);
        let (got, res) = read(&src, off, len);
        prop_assert!(res.is_ok(), "{:?}", res);
        prop_assert_eq!(joined(&got, off), &data[off as usize..]);
    }
}
