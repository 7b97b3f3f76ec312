//! `--bwlimit`: one token bucket shared by all transfers.
//!
//! Virtual-time pacing (GCRA): each grant of `n` bytes books `n / rate`
//! seconds on a shared clock, and the caller waits until its booking
//! starts. The rate is exact over any long transfer, whatever the chunk
//! size, and a burst allowance of a quarter second keeps short gaps from
//! being lost. The wait is the limiter's purpose, not polling: it is
//! one sleep per granted chunk, and none at all without a limit.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// A shared bandwidth limit.
#[derive(Debug)]
pub struct Limiter {
    rate: f64,
    burst: Duration,
    /// The shared clock, and the bytes granted so far.
    next: Mutex<(Instant, u64)>,
}

impl Limiter {
    /// A limit of `bytes_per_sec`.
    pub fn new(bytes_per_sec: u64) -> Limiter {
        Limiter {
            rate: bytes_per_sec.max(1) as f64,
            burst: Duration::from_millis(250),
            next: Mutex::new((Instant::now(), 0)),
        }
    }

    /// The rate in bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate as u64
    }

    /// A good chunk size for this rate: about 1/20 s of transfer, between
    /// 16 KiB and 4 MiB (big buffers, exact limits).
    pub fn chunk(&self) -> usize {
        ((self.rate / 20.0) as usize).clamp(16 << 10, 4 << 20)
    }

    /// Bytes granted so far (what the tests check pacing by).
    pub fn granted(&self) -> u64 {
        self.next.lock().1
    }

    /// Wait until `n` more bytes may be sent.
    pub fn acquire(&self, n: u64) {
        let wait = self.book(Instant::now(), n);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// Book `n` bytes at time `now`; returns how long the caller must wait.
    fn book(&self, now: Instant, n: u64) -> Duration {
        let mut g = self.next.lock();
        let (next, granted) = &mut *g;
        let earliest = now.checked_sub(self.burst).unwrap_or(now);
        if *next < earliest {
            *next = earliest;
        }
        *next += Duration::from_secs_f64(n as f64 / self.rate);
        *granted += n;
        next.saturating_duration_since(now)
    }
}

/// Parse a rate like `10M`, `512K`, `1.5G`, `100000` (bytes per second;
/// K/M/G/T are binary multiples, an optional trailing `B`, `/s` allowed).
/// Returns `String`: clap's `value_parser` contract (the message is its usage error).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some(c @ ('k' | 'K' | 'm' | 'M' | 'g' | 'G' | 't' | 'T')) => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => 1 << 40,
            };
            (&t[..t.len() - 1], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid rate {s:?} (examples: 10M, 512K, 1G)"))?;
    if v.is_nan() || v <= 0.0 || !v.is_finite() {
        return Err(format!("invalid rate {s:?}: must be positive"));
    }
    Ok((v * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates() {
        assert_eq!(parse_rate("10M").unwrap(), 10 << 20);
        assert_eq!(parse_rate("512K").unwrap(), 512 << 10);
        assert_eq!(parse_rate("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_rate("100000").unwrap(), 100_000);
        assert_eq!(parse_rate("2MB/s").unwrap(), 2 << 20);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("-1M").is_err());
    }

    #[test]
    fn bookings_add_up_to_the_rate() {
        // Behaviour, not timing: with the clock held still, 10 s worth of
        // bytes asks for 10 s of waiting, minus the burst allowance.
        let l = Limiter::new(1 << 20);
        let t0 = Instant::now() + Duration::from_secs(5);
        let mut wait = Duration::ZERO;
        for _ in 0..160 {
            wait = l.book(t0, 64 << 10);
        }
        assert_eq!(wait, Duration::from_secs(10) - Duration::from_millis(250));
        // An idle period gives at most the burst allowance back.
        let later = t0 + Duration::from_secs(100);
        assert_eq!(l.book(later, 1 << 20), Duration::from_millis(750));
        assert_eq!(l.chunk(), 52428);
    }
}
