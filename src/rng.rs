//! Random numbers that are a pure function of a seed and a position.
//!
//! Two kinds:
//! - [`counter_u32`]: a counter-based hash (PCG-RXS-M-XS chained over the coordinates), so
//!   the sample at `(seed, iteration, prompt, response, position)` is the same whichever order
//!   things run in, on every backend, and in a WGSL kernel that uses the same 32-bit ops.
//! - [`SplitMix64`]: a sequential generator for set-up work (prompt sets, initial weights).

/// One round of the PCG-RXS-M-XS 32-bit hash (Jarzynski & Olano, "Hash Functions for GPU Rendering", 2020).
#[inline]
pub fn pcg_hash(v: u32) -> u32 {
    let state = v.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
    let word = ((state >> ((state >> 28) + 4)) ^ state).wrapping_mul(277_803_737);
    (word >> 22) ^ word
}

/// A 32-bit random word for a coordinate; each coordinate is folded into the hash in turn.
#[inline]
pub fn counter_u32(seed: u64, coords: &[u32]) -> u32 {
    let mut h = pcg_hash(seed as u32 ^ pcg_hash((seed >> 32) as u32));
    for &c in coords {
        h = pcg_hash(h ^ c);
    }
    h
}

/// A uniform number in `[0, 1)` with 24 bits, exactly representable in f32.
#[inline]
pub fn unit_f32(bits: u32) -> f32 {
    (bits >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// SplitMix64 (Steele, Lea & Flood 2014): small, fast, and good enough for set-up work.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one named purpose, so adding draws to one purpose never shifts another.
    pub fn for_stream(seed: u64, stream: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in stream.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        Self::new(seed ^ h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (n > 0), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Standard normal by Box–Muller.
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            xs.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_hash_depends_on_every_coordinate() {
        let base = counter_u32(5, &[1, 2, 3]);
        assert_eq!(base, counter_u32(5, &[1, 2, 3]));
        assert_ne!(base, counter_u32(6, &[1, 2, 3]));
        assert_ne!(base, counter_u32(5, &[1, 2, 4]));
        assert_ne!(base, counter_u32(5, &[2, 1, 3]));
        assert_ne!(base, counter_u32(5 | (1 << 40), &[1, 2, 3]));
    }

    #[test]
    fn unit_is_roughly_uniform() {
        let n = 100_000;
        let mean: f64 = (0..n)
            .map(|i| unit_f32(counter_u32(1, &[i])) as f64)
            .sum::<f64>()
            / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        let mut r = SplitMix64::new(3);
        let m2: f64 = (0..n).map(|_| r.normal().powi(2)).sum::<f64>() / n as f64;
        assert!((m2 - 1.0).abs() < 0.03, "{m2}");
    }
}
