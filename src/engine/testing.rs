//! A small deterministic generator for the unit tests' property checks: a seeded
//! splitmix64 stream, and helpers that draw integers, weighted choices, vectors and strings
//! from it. A test loops over its cases from a fixed seed, so every run sees the same
//! inputs and a failing input, printed by the assertion, fails again on the next run.

use std::ops::{Bound, RangeBounds, RangeInclusive};

/// Every `char` but `'\n'`, as three ranges: the controls before it, the rest of the Basic
/// Multilingual Plane up to the surrogates, and everything after them.
pub(crate) const ANY_BUT_NEWLINE: &[(char, char)] =
    &[('\0', '\t'), ('\u{b}', '\u{d7ff}'), ('\u{e000}', char::MAX)];

/// A seeded stream of pseudo-random values (splitmix64).
#[derive(Debug, Clone)]
pub(crate) struct Gen {
    state: u64,
}

impl Gen {
    /// The stream `seed` starts.
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// 64 uniformly distributed bits.
    pub(crate) fn u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n`; `n` is not zero.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "an empty range");
        // The high half of a 128-bit product: uniform up to a bias of n / 2^64.
        ((u128::from(self.u64()) * u128::from(n)) >> 64) as u64
    }

    /// A fair coin.
    pub(crate) fn bool(&mut self) -> bool {
        self.u64() >> 63 == 1
    }

    /// `true` with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        // 53 bits: a uniform float in [0, 1).
        ((self.u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// A byte in `range`, uniformly.
    pub(crate) fn u8_in(&mut self, range: RangeInclusive<u8>) -> u8 {
        let (start, end) = (*range.start(), *range.end());
        assert!(start <= end, "an empty range");
        start + self.below(u64::from(end - start) + 1) as u8
    }

    /// A `usize` in `range`, uniformly.
    pub(crate) fn usize_in(&mut self, range: impl RangeBounds<usize>) -> usize {
        let start = match range.start_bound() {
            Bound::Included(&n) => n,
            Bound::Excluded(&n) => n + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&n) => n,
            Bound::Excluded(&n) => n.checked_sub(1).expect("an empty range"),
            Bound::Unbounded => usize::MAX,
        };
        assert!(start <= end, "an empty range");
        start + self.below((end - start) as u64 + 1) as usize
    }

    /// An index into `weights`, each chosen in proportion to its weight.
    pub(crate) fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut roll = self.below(total);
        for (i, &weight) in weights.iter().enumerate() {
            if roll < u64::from(weight) {
                return i;
            }
            roll -= u64::from(weight);
        }
        unreachable!("the roll is below the total weight")
    }

    /// One of `items`, uniformly.
    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// A vector whose length is drawn from `len`, each element made by `element`.
    pub(crate) fn vec<T>(
        &mut self,
        len: impl RangeBounds<usize>,
        mut element: impl FnMut(&mut Self) -> T,
    ) -> Vec<T> {
        let len = self.usize_in(len);
        (0..len).map(|_| element(self)).collect()
    }

    /// A `char` from one of `ranges` (inclusive, none spanning the surrogates): a range
    /// chosen uniformly, then a `char` uniformly within it. Short ranges are drawn as often
    /// as long ones, so a lone `!` next to `#`..=`~` is half of the draws.
    pub(crate) fn char_in(&mut self, ranges: &[(char, char)]) -> char {
        let &(start, end) = self.pick(ranges);
        let (start, end) = (u32::from(start), u32::from(end));
        assert!(start <= end, "an empty range");
        let code = start + self.below(u64::from(end - start) + 1) as u32;
        char::from_u32(code).expect("the ranges hold no surrogate")
    }

    /// A string whose length in `char`s is drawn from `len`, each `char` from `ranges`
    /// (see [`char_in`](Self::char_in)).
    pub(crate) fn string(
        &mut self,
        len: impl RangeBounds<usize>,
        ranges: &[(char, char)],
    ) -> String {
        let len = self.usize_in(len);
        (0..len).map(|_| self.char_in(ranges)).collect()
    }

    /// A string of `len` printable ASCII characters (space to `~`).
    pub(crate) fn printable_string(&mut self, len: impl RangeBounds<usize>) -> String {
        self.string(len, &[(' ', '~')])
    }

    /// Any finite `f64`: normal numbers mostly, subnormal ones and both zeros sometimes,
    /// with either sign.
    pub(crate) fn finite_f64(&mut self) -> f64 {
        const MANTISSA: u64 = (1 << 52) - 1;
        let sign = self.u64() & (1 << 63);
        let bits = match self.weighted(&[20, 3, 4]) {
            0 => {
                let exponent = self.below(2046) + 1;
                sign | exponent << 52 | self.u64() & MANTISSA
            }
            1 => sign | (self.u64() & MANTISSA).max(1),
            _ => sign,
        };
        f64::from_bits(bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_their_ranges_and_reach_their_ends() {
        let mut g = Gen::new(1);
        let bytes: Vec<u8> = (0..4096).map(|_| g.u8_in(0x21..=0x7e)).collect();
        assert!(bytes.iter().all(|b| (0x21..=0x7e).contains(b)));
        assert!(bytes.contains(&0x21) && bytes.contains(&0x7e));
        let lens: Vec<usize> = (0..4096).map(|_| g.usize_in(3..7)).collect();
        assert!(lens.iter().all(|n| (3..7).contains(n)));
        assert!(lens.contains(&3) && lens.contains(&6));
        assert_eq!(g.usize_in(5..=5), 5);
        let picks = (0..4096).filter(|_| g.weighted(&[3, 0, 1]) == 0).count();
        assert!((2800..3300).contains(&picks), "{picks}");
        assert!((0..4096).all(|_| g.weighted(&[3, 0, 1]) != 1));
        let s = g.string(0..=8, ANY_BUT_NEWLINE);
        assert!(s.chars().count() <= 8 && !s.contains('\n'), "{s:?}");
        assert!((0..4096).all(|_| g.finite_f64().is_finite()));
    }

    #[test]
    fn a_seed_replays_its_stream() {
        let (mut a, mut b) = (Gen::new(42), Gen::new(42));
        assert!((0..64).all(|_| a.u64() == b.u64()));
        assert_ne!(Gen::new(1).u64(), Gen::new(2).u64());
    }
}
