use super::*;
use std::os::fd::BorrowedFd;

/// Bytes handed out at most `step` at a time.
struct Slow<'a> {
    data: &'a [u8],
    step: usize,
}

impl SourceFile for Slow<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// Equal only when every byte and the length agree, whatever the
/// expected size says and however the reads are cut.
#[test]
fn same_bytes_compares_every_byte_and_the_length() {
    let big: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    let mut last = big.clone();
    *last.last_mut().unwrap() ^= 1;
    let short = &big[..big.len() - 1];
    let cases: [(&[u8], &[u8], bool); 6] = [
        (&big, &big, true),
        (&big, &last, false),
        (&big, short, false),
        (short, &big, false),
        (b"", b"", true),
        (b"", b"x", false),
    ];
    for (x, y, want) in cases {
        for size in [0, 1, x.len() as u64, y.len() as u64, 1 << 40] {
            for step in [1, 7, 1 << 20] {
                let (mut a, mut b) = (Slow { data: x, step }, Slow { data: y, step });
                let got = same_bytes(&mut a, &mut b, size).unwrap();
                assert_eq!(
                    got,
                    want,
                    "{} vs {} bytes, size {size}, step {step}",
                    x.len(),
                    y.len()
                );
            }
        }
    }
}
