//! Numeric kernels every CPU text shares: a vectorizable `exp`, lane-parallel sums and the
//! element-wise maps that keep one loop per formula monomorphic (so it vectorizes). The fused
//! engines and `objective::loss::evaluate` call these.

/// `eˣ` with no branches or calls, so loops over it vectorize: Cody–Waite reduction to
/// `r ∈ [−ln2/2, ln2/2]`, a degree-7 Taylor polynomial and `2ᵏ` from exponent bits: within
/// 1.0e-7 relative of f64's `exp` on [−87, 88] (measured; tested below one ulp, 1.2e-7).
/// 0 below −87.3 (where `eˣ` nears the subnormal range); +∞ above 88 (as the true `eˣ` is past
/// 1.6e38 there: a ratio that large is a diverged run, which the trainer must see as such).
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2²³: adding it rounds to an integer, which then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.0);
    let big = xc * LOG2_E + ROUND;
    let k = big - ROUND;
    let r = xc - k * LN2_HI - k * LN2_LO;
    let poly = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // big's bits are 0x4B40_0000 + k; 2ᵏ has exponent bits k + 127.
    let scale = f32::from_bits(big.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    if x < -87.3 {
        0.0
    } else if x > 88.0 {
        f32::INFINITY
    } else {
        poly * scale
    }
}

/// A reduction of `x` over eight independent lanes (short rows vectorize instead of
/// forming one long dependency chain).
#[inline(always)]
pub fn lanes8(x: &[f32], init: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut lanes = [init; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder().iter().fold(init, |a, &b| op(a, b));
    for c in chunks {
        for (l, &b) in lanes.iter_mut().zip(c) {
            *l = op(*l, b);
        }
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    op(op(op(op(a, e), op(b, f)), op(op(c, g), op(d, h))), rest)
}

/// `Σ x` in f64 over eight independent lanes (vectorizes; no long dependency chain).
#[inline(always)]
pub fn sum_f64(x: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let rest: f64 = chunks.remainder().iter().map(|&v| v as f64).sum();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v as f64;
        }
    }
    lanes.iter().sum::<f64>() + rest
}

/// `Σ_{m_i ≠ 0} x_i` in f64 over eight lanes, for a 0/1 mask `m`: what `x` holds where `m`
/// is 0 (padding: junk, ∞, NaN) never reaches the sum (a select, so it stays exact).
#[inline(always)]
pub fn masked_sum_f64(m: &[f32], x: &[f32]) -> f64 {
    masked_dot_f64(m, x, m)
}

/// `Σ_{m_i ≠ 0} w_i·x_i` in f64 over eight lanes, as [`masked_sum_f64`]; vectorizes.
#[inline(always)]
pub fn masked_dot_f64(m: &[f32], x: &[f32], w: &[f32]) -> f64 {
    let term = |m: f32, x: f32, w: f32| if m != 0.0 { x as f64 * w as f64 } else { 0.0 };
    let mut lanes = [0.0f64; 8];
    let (mc, xc, wc) = (m.chunks_exact(8), x.chunks_exact(8), w.chunks_exact(8));
    let rest: f64 = (mc
        .remainder()
        .iter()
        .zip(xc.remainder())
        .zip(wc.remainder()))
    .map(|((&m, &x), &w)| term(m, x, w))
    .sum();
    for ((m8, x8), w8) in mc.zip(xc).zip(wc) {
        for l in 0..8 {
            lanes[l] += term(m8[l], x8[l], w8[l]);
        }
    }
    lanes.iter().sum::<f64>() + rest
}

/// `Σ x²` over sixteen independent f32 lanes.
#[inline(always)]
pub fn sum_sq(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let rest: f32 = chunks.remainder().iter().map(|&v| v * v).sum();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v * v;
        }
    }
    lanes.iter().sum::<f32>() + rest
}

/// `(a[i], b[i]) = f(x[i], y[i])`: one monomorphic loop per closure, so it vectorizes.
#[inline(always)]
pub fn map2(
    x: &[f32],
    y: &[f32],
    a: &mut [f32],
    b: &mut [f32],
    f: impl Fn(f32, f32) -> (f32, f32),
) {
    for (((a, b), &x), &y) in a.iter_mut().zip(b.iter_mut()).zip(x).zip(y) {
        (*a, *b) = f(x, y);
    }
}

/// `(a[i], b[i]) = f(x[i], y[i], z[i])`, as `map2`.
#[inline(always)]
pub fn map3(
    x: &[f32],
    y: &[f32],
    z: &[f32],
    a: &mut [f32],
    b: &mut [f32],
    f: impl Fn(f32, f32, f32) -> (f32, f32),
) {
    for ((((a, b), &x), &y), &z) in a.iter_mut().zip(b.iter_mut()).zip(x).zip(y).zip(z) {
        (*a, *b) = f(x, y, z);
    }
}

/// One row of logits at temperature `1/inv_t`, the text of the row log-softmax every CPU
/// engine uses: `z = x·inv_t`, `e = exp(z − max z)` (both written), returns
/// `(log Z, Σ e)` with `log Z = max z + ln Σ e`, so `log π_j = z_j − log Z`.
#[inline(always)]
pub fn row_softmax(x: &[f32], inv_t: f32, z: &mut [f32], e: &mut [f32]) -> (f32, f32) {
    for (zi, &xi) in z.iter_mut().zip(x) {
        *zi = xi * inv_t;
    }
    let m = lanes8(z, f32::MIN, f32::max);
    for (ei, &zi) in e.iter_mut().zip(z.iter()) {
        *ei = exp_fast(zi - m);
    }
    let total = lanes8(e, 0.0, |a, b| a + b);
    (m + total.ln(), total)
}

/// The probabilities `p = e/Σe` of a row [`row_softmax`] computed (into `p`) and its entropy
/// `H = −Σ p·log π` (`h` is scratch of the row's length; a token with `e = 0` adds nothing).
#[inline(always)]
pub fn row_entropy(
    z: &[f32],
    e: &[f32],
    (logz, total): (f32, f32),
    p: &mut [f32],
    h: &mut [f32],
) -> f32 {
    let inv = 1.0 / total;
    for (((p, hi), &ei), &zi) in p.iter_mut().zip(h.iter_mut()).zip(e).zip(z) {
        *p = ei * inv;
        *hi = if ei > 0.0 { *p * (zi - logz) } else { 0.0 };
    }
    -lanes8(h, 0.0, |a, b| a + b)
}

/// `buf` as `len` zeros, reusing its allocation.
#[inline(always)]
pub fn zeroed(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.clear();
    buf.resize(len, 0.0);
    buf
}

/// `buf` at length `len`, reusing its allocation and **not** clearing what it held: for a
/// pass that writes every element (a step's per-token buffers are rewritten each step, and a
/// memset of each of them first cost ~5 % of the fused lecture step on `scaled`).
#[inline(always)]
pub fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() > len {
        buf.truncate(len);
    } else {
        buf.resize(len, 0.0);
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_fast_matches_f64_exp_within_one_ulp() {
        let mut worst = 0.0f64;
        let steps = 400_000;
        for i in 0..=steps {
            let x = -87.0 + 175.0 * i as f32 / steps as f32;
            let (got, want) = (exp_fast(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
        }
        eprintln!("exp_fast: worst relative error {worst:e}");
        // One ulp of f32 is 2⁻²³ ≈ 1.2e-7 of the value at the bottom of a binade.
        assert!(worst < 1.2e-7, "worst relative error {worst:e}");
        assert_eq!(exp_fast(0.0), 1.0);
        assert_eq!(exp_fast(-87.5), 0.0);
        assert_eq!(exp_fast(-1e30), 0.0);
        assert!(exp_fast(88.0) > 1.6e38 && exp_fast(88.0).is_finite());
        assert_eq!(exp_fast(88.5), f32::INFINITY);
        assert_eq!(exp_fast(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_fast(f32::NEG_INFINITY), 0.0);
        assert!(exp_fast(f32::NAN).is_nan());
    }

    #[test]
    fn lane_sums_agree_with_sequential_f64() {
        let x: Vec<f32> = (0..1237)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        assert!((sum_f64(&x) - want).abs() < 1e-9 * want.abs().max(1.0));
        let want_sq: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
        assert!(((sum_sq(&x) as f64) - want_sq).abs() < 1e-5 * want_sq);
    }
}
