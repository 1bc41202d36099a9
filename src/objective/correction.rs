//! The mismatch lab's corrections (GRPO-SPEC §4's loss, with the sampler apart from the
//! learner): the responses were drawn by π_sampler, the learner rescored them as π_old, and each
//! token's policy-gradient term is weighted by ω_t, a function of `w_t = π_old/π_sampler`
//! (detached: a constant of the step for every rule but OPSM, which reads π_θ too):
//!
//! | rule | ω | source |
//! |---|---|---|
//! | `tis` | `clamp(w, low, high)` | TRL `token_truncate` / `sequence_truncate`, OpenRLHF `tis` |
//! | `mis` | `w` if `low ≤ w ≤ high`, else 0 | TRL `token_mask` / `sequence_mask` |
//! | `icepop` | as `mis`, per token | OpenRLHF `icepop` (IcePop) |
//! | `opsm` | 0 for a response with `A < 0` and `mean_t log(π_sampler/π_θ) > δ`, else 1 | DeepSeek-V3.2 eq. 9, TRL `off_policy_mask_threshold` |
//!
//! At the sequence level (tis, mis) `w_i = exp(Σ_t log w_t)` over the response's real tokens, as
//! TRL forms it. Without a recorded sampler log π (no gap) `π_sampler = π_old`, so `w = 1`, and
//! OPSM compares π_θ with π_old (TRL's rule when no vLLM log-probs exist).

use super::numeric::zeroed;
use crate::config::{AlgorithmConfig, IsCorrection, IsLevel};

/// One correction's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Correction {
    pub kind: IsCorrection,
    pub level: IsLevel,
    pub low: f32,
    pub high: f32,
    /// OPSM's δ.
    pub opsm_threshold: f32,
}

impl Correction {
    /// No correction.
    pub const NONE: Correction = Correction {
        kind: IsCorrection::None,
        level: IsLevel::Token,
        low: 0.0,
        high: 3.0,
        opsm_threshold: 0.5,
    };

    /// A config's correction.
    pub fn of(a: &AlgorithmConfig) -> Self {
        Self {
            kind: a.is_correction,
            level: a.is_level,
            low: a.is_threshold_low as f32,
            high: a.is_threshold_high as f32,
            opsm_threshold: a.opsm_threshold as f32,
        }
    }

    /// Whether a weight is applied at all.
    pub fn on(&self) -> bool {
        self.kind != IsCorrection::None
    }

    /// ω of one weight `w` under tis / mis / icepop.
    pub fn apply(&self, w: f32) -> f32 {
        match self.kind {
            IsCorrection::Tis => w.clamp(self.low, self.high),
            IsCorrection::Mis | IsCorrection::Icepop => {
                if w >= self.low && w <= self.high {
                    w
                } else {
                    0.0
                }
            }
            IsCorrection::None | IsCorrection::Opsm => 1.0,
        }
    }
}

/// One step's per-token inputs of a correction, each `[R·T]`: log π_θ, log π_old, the
/// sampler's log π (`None`: π_old), `A_t`, the mask; `T`.
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    pub logp: &'a [f32],
    pub old_logp: &'a [f32],
    pub sampler_logp: Option<&'a [f32]>,
    pub adv: &'a [f32],
    pub mask: &'a [f32],
    pub t: usize,
}

/// `ω_t` of every token (`[R·T]`, 0 on padding): the weight on its policy-gradient term.
pub fn weights(c: &Correction, x: &Tokens, out: &mut Vec<f32>) {
    let n = x.logp.len();
    let t = x.t.max(1);
    let (sampler, adv) = (x.sampler_logp.unwrap_or(x.old_logp), x.adv);
    let out = zeroed(out, n);
    for (i, row) in out.chunks_exact_mut(t).enumerate() {
        let span = i * t..(i + 1) * t;
        let mask = &x.mask[span.clone()];
        match (c.kind, c.level) {
            (IsCorrection::Opsm, _) => {
                // mean_t log(π_sampler/π_θ) over the real tokens (TRL: clamp(len, min = 1)).
                let (mut sum, mut len) = (0.0f64, 0.0f64);
                for ((&m, &s), &l) in mask
                    .iter()
                    .zip(&sampler[span.clone()])
                    .zip(&x.logp[span.clone()])
                {
                    if m != 0.0 {
                        sum += (s - l) as f64;
                        len += 1.0;
                    }
                }
                let far = sum / len.max(1.0) > c.opsm_threshold as f64;
                for ((o, &m), &a) in row.iter_mut().zip(mask).zip(&adv[span.clone()]) {
                    *o = if m != 0.0 && !(far && a < 0.0) {
                        1.0
                    } else {
                        0.0
                    };
                }
            }
            (_, IsLevel::Sequence) => {
                let mut sum = 0.0f64;
                for ((&m, &o), &s) in mask
                    .iter()
                    .zip(&x.old_logp[span.clone()])
                    .zip(&sampler[span.clone()])
                {
                    if m != 0.0 {
                        sum += (o - s) as f64;
                    }
                }
                let w = c.apply(sum.exp() as f32);
                for (o, &m) in row.iter_mut().zip(mask) {
                    *o = if m != 0.0 { w } else { 0.0 };
                }
            }
            (_, IsLevel::Token) => {
                let cells = mask
                    .iter()
                    .zip(&x.old_logp[span.clone()])
                    .zip(&sampler[span]);
                for (o, ((&m, &old), &s)) in row.iter_mut().zip(cells) {
                    *o = if m != 0.0 {
                        c.apply((old - s).exp())
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// The sampler–learner gap of one rollout, under TRL's metric names (`sampling/*`): the IS
/// weight's range and mean over the real tokens (per response at the sequence level) — the
/// weight as applied (after the clamp or the mask), or the raw `w` when no correction is on —,
/// `|log π_old − log π_sampler|`'s mean and max, the weights' effective sample size
/// `(Σω)²/(N·Σω²)` (1 = no loss), and the fraction of real tokens whose weight is 0 (OPSM's at
/// the rollout, θ = θ_old).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GapStats {
    pub ratio_min: f32,
    pub ratio_mean: f32,
    pub ratio_max: f32,
    pub logp_diff_mean: f32,
    pub logp_diff_max: f32,
    pub ess: f32,
    pub masked_fraction: f32,
}

/// [`GapStats`] of a rollout: `old`, `sampler` and `mask` `[R·T]`, `adv` `[R]` or `[R·T]`.
pub fn gap_stats(
    c: &Correction,
    old: &[f32],
    sampler: &[f32],
    adv: &[f32],
    mask: &[f32],
    t: usize,
) -> GapStats {
    let t = t.max(1);
    let per_token: Vec<f32>;
    let adv_t = if adv.len() == old.len() {
        adv
    } else {
        per_token = adv
            .iter()
            .flat_map(|&a| std::iter::repeat_n(a, t))
            .collect();
        &per_token
    };
    let x = Tokens {
        logp: old,
        old_logp: old,
        sampler_logp: Some(sampler),
        adv: adv_t,
        mask,
        t,
    };
    // The weights as applied; with no rule, the raw w (tis with an unbounded band).
    let shown = if c.on() {
        *c
    } else {
        Correction {
            kind: IsCorrection::Tis,
            low: 0.0,
            high: f32::INFINITY,
            ..*c
        }
    };
    let mut w = Vec::new();
    weights(&shown, &x, &mut w);
    let sequence = c.level == IsLevel::Sequence && c.kind != IsCorrection::Opsm;
    let (mut n, mut sum, mut sq, mut lo, mut hi, mut zero) =
        (0.0f64, 0.0, 0.0, f32::MAX, f32::MIN, 0.0);
    let (mut diff_sum, mut diff_max, mut real) = (0.0f64, 0.0f32, 0.0f64);
    for (i, &m) in mask.iter().enumerate() {
        if m == 0.0 {
            continue;
        }
        real += 1.0;
        let d = (old[i] - sampler[i]).abs();
        diff_sum += d as f64;
        diff_max = diff_max.max(d);
        zero += (w[i] == 0.0) as u8 as f64;
        // At the sequence level one weight per response: its first real token stands for it.
        let first = i % t == 0 || mask[i - 1] == 0.0;
        if sequence && !first {
            continue;
        }
        n += 1.0;
        sum += w[i] as f64;
        sq += (w[i] as f64).powi(2);
        lo = lo.min(w[i]);
        hi = hi.max(w[i]);
    }
    if n == 0.0 {
        return GapStats::default();
    }
    GapStats {
        ratio_min: lo,
        ratio_mean: (sum / n) as f32,
        ratio_max: hi,
        logp_diff_mean: (diff_sum / real) as f32,
        logp_diff_max: diff_max,
        ess: if sq > 0.0 {
            (sum * sum / (n * sq)) as f32
        } else {
            0.0
        },
        masked_fraction: (zero / real) as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs<'a>(
        logp: &'a [f32],
        old: &'a [f32],
        sampler: &'a [f32],
        adv: &'a [f32],
        mask: &'a [f32],
    ) -> Tokens<'a> {
        Tokens {
            logp,
            old_logp: old,
            sampler_logp: Some(sampler),
            adv,
            mask,
            t: 3,
        }
    }

    fn rule(kind: IsCorrection, level: IsLevel, low: f32, high: f32) -> Correction {
        Correction {
            kind,
            level,
            low,
            high,
            opsm_threshold: 0.5,
        }
    }

    /// Each rule's weights from its definition, on two responses of three positions (the last
    /// of the second is padding): w = π_old/π_sampler = e^{0.2}, e^{−1}, e^{1.5} | e^{0.1},
    /// e^{−0.1}, pad.
    #[test]
    fn weights_from_the_definitions() {
        let old = [0.2f32, -1.0, 1.5, 0.1, -0.1, 9.0];
        let sampler = [0.0f32; 6];
        let logp = [0.0f32, 0.0, 0.0, -2.0, -2.0, 0.0];
        let adv = [1.0f32, 1.0, 1.0, -1.0, -1.0, -1.0];
        let mask = [1.0f32, 1.0, 1.0, 1.0, 1.0, 0.0];
        let x = inputs(&logp, &old, &sampler, &adv, &mask);
        let e = |v: f32| v.exp();
        let mut w = Vec::new();
        let close = |got: &[f32], want: &[f32]| {
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
            }
        };
        // tis, token: clamp to [0.5, 3].
        weights(
            &rule(IsCorrection::Tis, IsLevel::Token, 0.5, 3.0),
            &x,
            &mut w,
        );
        close(&w, &[e(0.2), 0.5, 3.0, e(0.1), e(-0.1), 0.0]);
        // mis / icepop, token: zero outside [0.5, 3].
        for kind in [IsCorrection::Mis, IsCorrection::Icepop] {
            weights(&rule(kind, IsLevel::Token, 0.5, 3.0), &x, &mut w);
            close(&w, &[e(0.2), 0.0, 0.0, e(0.1), e(-0.1), 0.0]);
        }
        // Sequence level: w_1 = e^{0.7} (inside), w_2 = e^{0} = 1; tis clamps e^{0.7} to 1.5.
        weights(
            &rule(IsCorrection::Tis, IsLevel::Sequence, 0.0, 1.5),
            &x,
            &mut w,
        );
        close(&w, &[1.5, 1.5, 1.5, 1.0, 1.0, 0.0]);
        weights(
            &rule(IsCorrection::Mis, IsLevel::Sequence, 0.0, 1.5),
            &x,
            &mut w,
        );
        close(&w, &[0.0, 0.0, 0.0, 1.0, 1.0, 0.0]);
        // OPSM: response 2 has A < 0 and mean log(π_sampler/π_θ) = 2 > 0.5: dropped; response 1
        // (mean 0, A > 0) kept.
        weights(
            &rule(IsCorrection::Opsm, IsLevel::Token, 0.0, 3.0),
            &x,
            &mut w,
        );
        close(&w, &[1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        // The same response with A > 0 is kept whatever its distance.
        let pos = [1.0f32; 6];
        let x_pos = Tokens { adv: &pos, ..x };
        weights(
            &rule(IsCorrection::Opsm, IsLevel::Token, 0.0, 3.0),
            &x_pos,
            &mut w,
        );
        close(&w, &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
        // No sampler log π: π_sampler = π_old, every weight 1 on real tokens.
        let none = Tokens {
            sampler_logp: None,
            ..x
        };
        weights(
            &rule(IsCorrection::Tis, IsLevel::Token, 0.5, 3.0),
            &none,
            &mut w,
        );
        close(&w, &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
    }

    #[test]
    fn gap_statistics_from_their_definitions() {
        let old = [0.2f32, -1.0, 1.5, 0.1, -0.1, 9.0];
        let sampler = [0.0f32; 6];
        let adv = [1.0f32, -1.0];
        let mask = [1.0f32, 1.0, 1.0, 1.0, 1.0, 0.0];
        // No correction: the raw w over the 5 real tokens.
        let raw = [0.2f32, -1.0, 1.5, 0.1, -0.1].map(|v| v.exp());
        let g = gap_stats(&Correction::NONE, &old, &sampler, &adv, &mask, 3);
        let mean = raw.iter().sum::<f32>() / 5.0;
        let ess = raw.iter().sum::<f32>().powi(2) / (5.0 * raw.iter().map(|x| x * x).sum::<f32>());
        assert!((g.ratio_mean - mean).abs() < 1e-5, "{g:?}");
        assert!((g.ratio_min - (-1.0f32).exp()).abs() < 1e-6);
        assert!((g.ratio_max - 1.5f32.exp()).abs() < 1e-5);
        assert!((g.logp_diff_mean - 2.9 / 5.0).abs() < 1e-6);
        assert_eq!(g.logp_diff_max, 1.5);
        assert!((g.ess - ess).abs() < 1e-5);
        assert_eq!(g.masked_fraction, 0.0);
        // mis in [0.5, 3]: two of five real tokens zeroed.
        let mis = rule(IsCorrection::Mis, IsLevel::Token, 0.5, 3.0);
        let g = gap_stats(&mis, &old, &sampler, &adv, &mask, 3);
        assert!((g.masked_fraction - 0.4).abs() < 1e-6);
        assert_eq!(g.ratio_min, 0.0);
        // Sequence level: one weight per response (e^{0.7}, 1).
        let seq = rule(IsCorrection::Tis, IsLevel::Sequence, 0.0, 3.0);
        let g = gap_stats(&seq, &old, &sampler, &adv, &mask, 3);
        assert!(
            (g.ratio_mean - (0.7f32.exp() + 1.0) / 2.0).abs() < 1e-5,
            "{g:?}"
        );
    }
}
