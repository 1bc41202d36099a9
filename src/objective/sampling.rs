//! Categorical sampling from logits with temperature, top-k and top-p, driven by a
//! counter-based RNG: the token at `(seed, iteration, prompt, response, position)` does
//! not depend on the order of work, so a WGSL kernel can reproduce it.

use crate::rng::{counter_u32, unit_f32};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
}

impl SamplingParams {
    /// A run's sampling settings.
    pub fn of(c: &crate::config::SamplingConfig) -> Self {
        Self {
            temperature: c.temperature as f32,
            top_k: c.top_k,
            top_p: c.top_p as f32,
        }
    }
}

/// Unnormalised weights of the distribution actually sampled from: `exp(l/T − max)`,
/// restricted to the top-k tokens and to the top-p nucleus (0 for dropped tokens).
/// `rank(i)` counts tokens with a larger scaled logit, or an equal one and a lower id;
/// token `i` is kept when `rank < top_k` and the weight ranked before it is below
/// `top_p · total` (so the token that crosses `top_p` is kept). The same arithmetic,
/// in the same order, as `row_weights` in `shaders/sample.wgsl`.
pub fn token_weights(logits: &[f32], p: SamplingParams) -> Vec<f32> {
    let v = logits.len();
    // Scale by 1/T with a multiplication (correctly rounded on every GPU, unlike division).
    let inv_t = 1.0 / p.temperature;
    let scaled: Vec<f32> = logits.iter().map(|l| l * inv_t).collect();
    let m = scaled.iter().fold(f32::MIN, |m, &x| m.max(x));
    let mut w = Vec::with_capacity(v);
    let mut total = 0.0f32;
    for &x in &scaled {
        let e = (x - m).exp();
        w.push(e);
        total += e;
    }
    let filter_k = p.top_k > 0 && p.top_k < v;
    let filter_p = p.top_p < 1.0;
    if !(filter_k || filter_p) {
        return w;
    }
    let keep: Vec<bool> = (0..v)
        .map(|i| {
            let mut rank = 0;
            let mut before = 0.0f32;
            for j in 0..v {
                if scaled[j] > scaled[i] || (scaled[j] == scaled[i] && j < i) {
                    rank += 1;
                    before += w[j];
                }
            }
            (!filter_k || rank < p.top_k) && (!filter_p || before < p.top_p * total)
        })
        .collect();
    w.iter()
        .zip(keep)
        .map(|(&x, k)| if k { x } else { 0.0 })
        .collect()
}

/// The normalised sampling distribution (for display and tests).
pub fn sampling_probs(logits: &[f32], p: SamplingParams) -> Vec<f32> {
    let w = token_weights(logits, p);
    let total: f32 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

/// Inverse-CDF draw over unnormalised weights with uniform `u ∈ [0, 1)`; never returns a
/// zero-weight token. As `draw` in `shaders/sample.wgsl`.
pub fn draw(weights: &[f32], u: f32) -> u32 {
    draw_from(weights, weight_total(weights), u)
}

/// `Σ weights`, summed in order (as `draw` sums it).
pub fn weight_total(weights: &[f32]) -> f32 {
    let mut kept = 0.0f32;
    for &w in weights {
        kept += w;
    }
    kept
}

/// `draw` with the weights' total computed once per row (same result).
pub fn draw_from(weights: &[f32], kept: f32, u: f32) -> u32 {
    let target = u * kept;
    let mut acc = 0.0f32;
    let mut last = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            acc += w;
            last = i;
            if target < acc {
                return i as u32;
            }
        }
    }
    last as u32
}

/// The uniform for one sampled token (as in the kernel).
pub fn token_uniform(seed: u64, iteration: u32, prompt: u32, response: u32, position: u32) -> f32 {
    unit_f32(counter_u32(seed, &[iteration, prompt, response, position]))
}

/// Sample `G` responses per prompt for a per-position policy.
/// `logits`: `[B, T, V]` flattened; returns tokens `[B, G, T]` flattened.
#[allow(clippy::too_many_arguments)]
pub fn sample_independent(
    logits: &[f32],
    b: usize,
    t: usize,
    v: usize,
    g: usize,
    params: SamplingParams,
    seed: u64,
    iteration: u32,
) -> Vec<u32> {
    let mut out = vec![0u32; b * g * t];
    sample_independent_into(logits, 0, (t, v, g), params, (seed, iteration), &mut out);
    out
}

/// [`sample_independent`] for the prompts `first..` of a batch whose rows `logits` holds
/// (`[b, T, V]`, `b` of them), into `out [b·G·T]`: the same draws as the whole batch's (each
/// is keyed by its prompt's index in the batch), so a batch can be drawn in parts.
pub fn sample_independent_into(
    logits: &[f32],
    first: usize,
    (t, v, g): (usize, usize, usize),
    params: SamplingParams,
    (seed, iteration): (u64, u32),
    out: &mut [u32],
) {
    let b = logits.len() / (t * v).max(1);
    for bi in 0..b {
        for ti in 0..t {
            let row = &logits[(bi * t + ti) * v..(bi * t + ti + 1) * v];
            let probs = sampling_probs(row, params);
            let kept = weight_total(&probs);
            let prompt = (first + bi) as u32;
            for gi in 0..g {
                let u = unit_f32(counter_u32(
                    seed,
                    &[iteration, prompt, gi as u32, ti as u32],
                ));
                out[(bi * g + gi) * t + ti] = draw_from(&probs, kept, u);
            }
        }
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), as an f32: what a sampler computing in
/// bf16 sees of a logit. NaN stays NaN; values past bf16's range become ±∞.
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    f32::from_bits(bits.wrapping_add(0x7fff + lsb) & 0xffff_0000)
}

/// log π_sampler of every drawn token: its probability under the distribution drawn from
/// ([`token_weights`] of its row, renormalised; top-k / top-p included). `logits [B, T, V]`
/// (as the sampler saw them) with shape `(B, T, V, G)`, `tokens [B, G, T]` → `[B, G, T]`.
pub fn sampler_logp(
    logits: &[f32],
    (b, t, v, g): (usize, usize, usize, usize),
    params: SamplingParams,
    tokens: &[u32],
) -> Vec<f32> {
    let mut out = vec![0f32; b * g * t];
    for bi in 0..b {
        for ti in 0..t {
            let w = token_weights(&logits[(bi * t + ti) * v..(bi * t + ti + 1) * v], params);
            let total = w.iter().map(|&x| x as f64).sum::<f64>();
            for gi in 0..g {
                let i = (bi * g + gi) * t + ti;
                out[i] = (w[tokens[i] as usize] as f64 / total).ln() as f32;
            }
        }
    }
    out
}

/// A logit outside the sampler's kept support (`sampling.keep_sampling_mask`): far below any
/// real logit, so its probability is 0 at any temperature the config allows, and finite, so
/// the `p · log π` of the learner's entropy stays 0 there instead of `0 · −∞`.
pub const OUTSIDE_SUPPORT: f32 = -1e30;

/// The tokens a row of sampling weights ([`token_weights`]) keeps, one bit per token id —
/// what top-k / top-p left the sampler to draw from (every token when they are off).
/// Supports are for vocabularies of at most 64 tokens (`sampling.keep_sampling_mask` checks).
pub fn support_bits(weights: &[f32]) -> u64 {
    debug_assert!(weights.len() <= 64);
    weights
        .iter()
        .enumerate()
        .filter(|&(_, &w)| w > 0.0)
        .fold(0u64, |bits, (i, _)| bits | (1 << i))
}

/// [`support_bits`] of every row of `logits [rows, V]` as the sampler saw them.
pub fn support_rows(logits: &[f32], v: usize, params: SamplingParams) -> Vec<u64> {
    logits
        .chunks_exact(v)
        .map(|row| support_bits(&token_weights(row, params)))
        .collect()
}

/// DeepSeek-V3.2's keep-sampling-mask on the learner's side: a row of logits restricted to the
/// sampler's support, every token outside it at [`OUTSIDE_SUPPORT`] — the softmax after it is
/// the learner's distribution renormalised over what the sampler could draw, and its gradient
/// reaches only those tokens' logits.
pub fn keep_support(logits: &mut [f32], bits: u64) {
    for (i, x) in logits.iter_mut().enumerate() {
        if bits >> i & 1 == 0 {
            *x = OUTSIDE_SUPPORT;
        }
    }
}

/// Greedy decoding: argmax per position (lowest id on ties). `[B, T, V]` → `[B, T]`.
pub fn argmax_rows(logits: &[f32], v: usize) -> Vec<u32> {
    logits
        .chunks(v)
        .map(|row| {
            let mut best = 0;
            for (i, x) in row.iter().enumerate() {
                if *x > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: SamplingParams = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    };

    #[test]
    fn empirical_frequencies_match_softmax() {
        // Chi-square goodness of fit, 4 degrees of freedom; 0.999 quantile is 18.47.
        let logits = [0.5f32, -1.0, 2.0, 0.0, 1.0];
        for temp in [1.0f32, 0.5, 2.0] {
            let p = SamplingParams {
                temperature: temp,
                ..PLAIN
            };
            let probs = sampling_probs(&logits, p);
            let n = 20_000;
            let tokens = sample_independent(&logits, 1, 1, 5, n, p, 42, 0);
            let mut counts = [0f64; 5];
            tokens.iter().for_each(|&t| counts[t as usize] += 1.0);
            let chi2: f64 = (0..5)
                .map(|i| {
                    let e = probs[i] as f64 * n as f64;
                    (counts[i] - e).powi(2) / e
                })
                .sum();
            assert!(
                chi2 < 18.47,
                "T={temp}: chi2 = {chi2}, counts {counts:?}, probs {probs:?}"
            );
        }
    }

    #[test]
    fn bf16_rounding_and_the_sampler_s_log_probs() {
        // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie (to even: 1), 1 + 3·2^-8 rounds up.
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(round_bf16(-2.5), -2.5);
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
        // The sampler's log π is the log of the distribution it draws from (top-k renormalised).
        let logits = [3.0f32, 2.0, 1.0, 0.0, 0.5, 0.1, -1.0, 2.0];
        let p = SamplingParams {
            temperature: 0.7,
            top_k: 2,
            top_p: 1.0,
        };
        let tokens = sample_independent(&logits, 1, 2, 4, 5, p, 3, 0);
        let lp = sampler_logp(&logits, (1, 2, 4, 5), p, &tokens);
        for (i, (&tok, &l)) in tokens.iter().zip(&lp).enumerate() {
            let row = &logits[(i % 2) * 4..(i % 2 + 1) * 4];
            let want = sampling_probs(row, p)[tok as usize].ln();
            assert!((l - want).abs() < 1e-6, "token {i}: {l} vs {want}");
        }
    }

    #[test]
    fn top_k_and_top_p_restrict_support() {
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let p = sampling_probs(&logits, SamplingParams { top_k: 2, ..PLAIN });
        assert!(p[2] == 0.0 && p[3] == 0.0 && (p[0] + p[1] - 1.0).abs() < 1e-6);
        // softmax ≈ [0.644, 0.237, 0.087, 0.032]: top_p 0.8 keeps the first two.
        let p = sampling_probs(
            &logits,
            SamplingParams {
                top_p: 0.8,
                ..PLAIN
            },
        );
        assert!(p[0] > 0.0 && p[1] > 0.0 && p[2] == 0.0 && p[3] == 0.0);
        let p = sampling_probs(
            &logits,
            SamplingParams {
                top_p: 0.5,
                ..PLAIN
            },
        );
        assert_eq!(p, vec![1.0, 0.0, 0.0, 0.0]);
        let toks = sample_independent(
            &logits,
            1,
            1,
            4,
            500,
            SamplingParams { top_k: 2, ..PLAIN },
            1,
            0,
        );
        assert!(toks.iter().all(|&t| t < 2));
    }

    #[test]
    fn huge_and_tiny_logits_stay_finite() {
        let p = sampling_probs(&[1e30, -1e30, 0.0], PLAIN);
        assert_eq!(p, vec![1.0, 0.0, 0.0]);
        let p = sampling_probs(&[-1e-30, 1e-30], PLAIN);
        assert!((p[0] - 0.5).abs() < 1e-6);
        assert_eq!(draw(&[0.0, 1.0, 0.0], 0.999_999), 1);
    }

    #[test]
    fn seeded() {
        let logits = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6];
        let a = sample_independent(&logits, 1, 2, 3, 8, PLAIN, 9, 3);
        assert_eq!(a, sample_independent(&logits, 1, 2, 3, 8, PLAIN, 9, 3));
        assert_ne!(a, sample_independent(&logits, 1, 2, 3, 8, PLAIN, 9, 4));
        assert_eq!(argmax_rows(&[0.0, 2.0, 2.0, 1.0, 0.0, 0.0], 3), vec![1, 0]);
    }
}
