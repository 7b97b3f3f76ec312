//! A set of byte ranges received or acknowledged (resume, parallel ranged
//! transfers). The common case is in-order
//! appends, which only move the end of the contiguous prefix: O(1) and
//! allocation-free. Ranges that arrive ahead of the prefix go to a
//! `BTreeMap` (the out-of-order fallback) and are absorbed into the prefix
//! as soon as the gap before them closes.

use std::collections::BTreeMap;

/// Byte ranges `[start, end)`, merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// Everything in `[0, prefix)` is present.
    prefix: u64,
    /// Disjoint, non-adjacent ranges beyond `prefix`: start → end.
    ahead: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// An empty set.
    pub const fn new() -> RangeSet {
        RangeSet {
            prefix: 0,
            ahead: BTreeMap::new(),
        }
    }

    /// Length of the contiguous prefix `[0, n)` (what a resume may skip).
    #[inline]
    pub fn prefix(&self) -> u64 {
        self.prefix
    }

    /// True when `[0, len)` is complete.
    pub fn is_complete(&self, len: u64) -> bool {
        self.prefix >= len
    }

    /// Number of bytes present.
    pub fn total(&self) -> u64 {
        self.prefix + self.ahead.iter().map(|(s, e)| e - s).sum::<u64>()
    }

    /// Add `[start, end)`.
    #[inline]
    pub fn insert(&mut self, start: u64, end: u64) {
        if end <= start {
            return;
        }
        if start <= self.prefix {
            // Fast path: extends (or lies within) the prefix.
            if end > self.prefix {
                self.prefix = end;
                if !self.ahead.is_empty() {
                    self.absorb();
                }
            }
            return;
        }
        self.insert_ahead(start, end);
    }

    /// Move ranges that now touch the prefix into it.
    fn absorb(&mut self) {
        while let Some((&s, &e)) = self.ahead.first_key_value() {
            if s > self.prefix {
                break;
            }
            self.ahead.pop_first();
            self.prefix = self.prefix.max(e);
        }
    }

    #[cold]
    fn insert_ahead(&mut self, mut start: u64, mut end: u64) {
        // Merge with a range that starts before and reaches `start`.
        if let Some((&s, &e)) = self.ahead.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.ahead.remove(&s);
            }
        }
        // Swallow ranges starting inside [start, end].
        while let Some((&s, &e)) = self.ahead.range(start..).next() {
            if s > end {
                break;
            }
            end = end.max(e);
            self.ahead.remove(&s);
        }
        self.ahead.insert(start, end);
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let mut v = Vec::with_capacity(1 + self.ahead.len());
        if self.prefix > 0 {
            v.push((0, self.prefix));
        }
        v.extend(self.ahead.iter().map(|(s, e)| (*s, *e)));
        v
    }

    /// The gaps within `[0, len)`: what is still missing.
    pub fn missing(&self, len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = self.prefix;
        for (&s, &e) in &self.ahead {
            if at >= len {
                break;
            }
            if s > at {
                out.push((at, s.min(len)));
            }
            at = at.max(e);
        }
        if at < len {
            out.push((at, len));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference model: a bitmap.
    fn model(ops: &[(u64, u64)], len: u64) -> Vec<bool> {
        let mut m = vec![false; len as usize];
        for &(s, e) in ops {
            for b in m.iter_mut().take(e as usize).skip(s as usize) {
                *b = true;
            }
        }
        m
    }

    proptest! {
        #[test]
        fn matches_bitmap(ops in proptest::collection::vec((0u64..200, 0u64..40), 0..60)) {
            let ops: Vec<(u64, u64)> = ops.into_iter().map(|(s, l)| (s, (s + l).min(240))).collect();
            let mut r = RangeSet::new();
            for &(s, e) in &ops { r.insert(s, e); }
            let m = model(&ops, 240);
            let mut got = vec![false; 240];
            for (s, e) in r.ranges() { for b in got.iter_mut().take(e as usize).skip(s as usize) { *b = true; } }
            prop_assert_eq!(&got, &m);
            // Ranges are disjoint and non-adjacent.
            let rs = r.ranges();
            for w in rs.windows(2) { prop_assert!(w[0].1 < w[1].0); }
            prop_assert_eq!(r.total(), m.iter().filter(|b| **b).count() as u64);
            let prefix = m.iter().take_while(|b| **b).count() as u64;
            prop_assert_eq!(r.prefix(), prefix);
            let missing: u64 = r.missing(240).iter().map(|(s, e)| e - s).sum();
            prop_assert_eq!(missing, 240 - r.total());
        }
    }

    #[test]
    fn in_order_is_prefix_only() {
        let mut r = RangeSet::new();
        for i in 0..1000u64 {
            r.insert(i * 10, i * 10 + 10);
        }
        assert_eq!(r.prefix(), 10_000);
        assert!(r.ahead.is_empty());
        r.insert(20_000, 20_010);
        r.insert(10_000, 20_000);
        assert_eq!(r.prefix(), 20_010);
        assert!(r.ahead.is_empty());
    }
}
