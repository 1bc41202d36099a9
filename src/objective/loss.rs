//! The per-token GRPO objective (GRPO-SPEC §4), once: the settings every engine reads and
//! the scalar formulas — ratio, clip, loss, KL k1/k2/k3 and the loss's derivative with respect
//! to `log π` — that the fused engines, the WGSL kernel tests and the app's inspector call.

use crate::config::{KlEstimator, LossAggMode, LossMode};

/// Everything the per-token loss needs besides the log-probs.
#[derive(Debug, Clone, Copy)]
pub struct LossSettings {
    pub mode: LossMode,
    pub epsilon_low: f32,
    pub epsilon_high: f32,
    /// β; the KL term is added to the loss only when this is > 0 and `kl_in_loss`.
    pub beta: f32,
    pub kl_in_loss: bool,
    pub kl_estimator: KlEstimator,
    pub agg: LossAggMode,
    /// BUG (gallery): ratio as `logπ / logπ_old`.
    pub bug_ratio_quotient: bool,
    /// Dr. GRPO's constant normaliser (`seq-mean-token-sum-norm`): the longest a response may
    /// be (`task.max_len` for the transformer, `n` for the lecture model), never the batch's
    /// padded width.
    pub max_len: usize,
}

impl LossSettings {
    /// The settings of a config's algorithm section.
    pub fn of(c: &crate::config::RunConfig) -> Self {
        let a = &c.algorithm;
        Self {
            mode: a.loss,
            epsilon_low: a.epsilon_low as f32,
            epsilon_high: a.epsilon_high as f32,
            beta: a.beta as f32,
            kl_in_loss: a.kl_penalty == crate::config::KlPenaltyMode::Loss,
            kl_estimator: a.kl_estimator,
            agg: a.loss_agg_mode,
            bug_ratio_quotient: a.bugs.ratio_as_logprob_quotient,
            max_len: c.max_len(),
        }
    }
}

/// Scalar references, one formula each, for the tests and for teaching.
pub mod reference {
    pub fn ratio(logp: f32, old_logp: f32) -> f32 {
        (logp - old_logp).exp()
    }

    pub fn clipped_token_loss(ratio: f32, adv: f32, eps_low: f32, eps_high: f32) -> f32 {
        let clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high);
        -(ratio * adv).min(clipped * adv)
    }

    /// KL in the reward, PPO-RLHF style: `r − β·Σ_t KL_t(π_old ‖ π_ref)` per response over its
    /// real tokens (`mask`, `old`, `refl`: `[B·G·T]`; `rewards`: `[B·G]`).
    pub fn kl_penalized_rewards(
        rewards: &[f32],
        mask: &[f32],
        old: &[f32],
        refl: &[f32],
        estimator: crate::config::KlEstimator,
        beta: f32,
    ) -> Vec<f32> {
        let t = mask.len() / rewards.len().max(1);
        rewards
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let span = i * t..(i + 1) * t;
                let kl: f32 = old[span.clone()]
                    .iter()
                    .zip(&refl[span.clone()])
                    .zip(&mask[span])
                    .map(|((&lp, &rf), &m)| kl_term(estimator, lp, rf, 0.0, f32::exp).0 * m)
                    .sum();
                r - beta * kl
            })
            .collect()
    }

    /// `(k1, k2, k3)` for `Δ = log π_ref − log π_θ`.
    pub fn kl(logp: f32, ref_logp: f32) -> (f32, f32, f32) {
        let d = ref_logp - logp;
        (-d, d * d / 2.0, d.exp() - d - 1.0)
    }

    /// One token's `(ratio, loss, kl, flags)` (flags: bit 0 clipped low, bit 1 clipped high),
    /// with the bug gallery's ratio switch: what the app's inspector shows.
    pub fn token_terms(
        s: &super::LossSettings,
        logp: f32,
        old_logp: f32,
        ref_logp: f32,
        adv: f32,
    ) -> (f32, f32, f32, u32) {
        use crate::config::{KlEstimator, LossMode};
        let ratio = if s.bug_ratio_quotient {
            logp / old_logp
        } else {
            (logp - old_logp).exp()
        };
        let mut loss = match s.mode {
            LossMode::Naive => -adv * logp,
            LossMode::Unclipped => -adv * ratio,
            LossMode::Clipped => clipped_token_loss(ratio, adv, s.epsilon_low, s.epsilon_high),
        };
        let (k1, k2, k3) = kl(logp, ref_logp);
        let kl = match s.kl_estimator {
            KlEstimator::K1 => k1,
            KlEstimator::K2 => k2,
            KlEstimator::K3 => k3,
        };
        if s.kl_in_loss && s.beta > 0.0 {
            loss += s.beta * kl;
        }
        let (low, high) = clip_flags(ratio, adv, 1.0 - s.epsilon_low, 1.0 + s.epsilon_high);
        (ratio, loss, kl, low as u32 | ((high as u32) << 1))
    }

    /// The aggregation (GRPO-SPEC §4) as each token's weight in the loss, `[R·T]` for `R` responses
    /// padded to `T` (`mask`: 1 on real tokens; padding weighs 0):
    /// - `seq-mean-token-mean` (GRPO): `1/(R·len_i)`, each response's mean, then their mean;
    /// - `token-mean` (DAPO): `1/Σ mask`, every token of the batch alike;
    /// - `seq-mean-token-sum-norm` (Dr. GRPO): `1/(R·max(max_len, T))`, a constant normaliser.
    ///
    /// The loss is `Σ_t w_t·ℓ_t`; burn's `aggregate` and the fused transformer weigh alike.
    pub fn aggregation_weights(
        agg: crate::config::LossAggMode,
        mask: &[f32],
        t: usize,
        max_len: usize,
    ) -> Vec<f32> {
        use crate::config::LossAggMode;
        let t = t.max(1);
        let r = mask.len() / t;
        let token_w = 1.0 / mask.iter().sum::<f32>().max(1.0);
        mask.chunks(t)
            .flat_map(|row| {
                let w = match agg {
                    LossAggMode::TokenMean => token_w,
                    LossAggMode::SeqMeanTokenMean => {
                        1.0 / (row.iter().sum::<f32>().max(1.0) * r as f32)
                    }
                    LossAggMode::SeqMeanTokenSumNorm => 1.0 / (r * max_len.max(t)) as f32,
                };
                row.iter().map(move |&m| if m == 0.0 { 0.0 } else { w })
            })
            .collect()
    }

    /// Whether the clip is active on a token, low and high: the ratio below `lo = 1 − ε_low` with
    /// `a < 0`, or above `hi = 1 + ε_high` with `a > 0` (where the clipped objective's gradient is
    /// 0). The clip fractions every engine logs count these (`lecture_step.wgsl` mirrors it).
    #[inline(always)]
    pub fn clip_flags(ratio: f32, adv: f32, lo: f32, hi: f32) -> (bool, bool) {
        (ratio < lo && adv < 0.0, ratio > hi && adv > 0.0)
    }

    /// The policy-gradient part of one token's loss and its derivative with respect to
    /// `log π`: `(term, ∂term/∂log π)` for advantage `a`, ratio `r = π/π_old` and `lp = log π`.
    /// Clipped: the derivative is `−a·r` wherever the unclipped branch is the minimum (or the
    /// ratio is inside the clip range), else 0. `#[inline(always)]` so the fused engines' loops
    /// over tokens specialise it per mode.
    #[inline(always)]
    pub fn pg_term(
        mode: crate::config::LossMode,
        a: f32,
        r: f32,
        lp: f32,
        lo: f32,
        hi: f32,
    ) -> (f32, f32) {
        use crate::config::LossMode;
        match mode {
            LossMode::Naive => (-a * lp, -a),
            LossMode::Unclipped => (-a * r, -a * r),
            LossMode::Clipped => {
                let (u, c) = (r * a, r.clamp(lo, hi) * a);
                let live = u <= c || (r > lo && r < hi);
                (-u.min(c), if live { -a * r } else { 0.0 })
            }
        }
    }

    /// One token's KL estimate and `β·∂KL/∂log π`, with `Δ = log π_ref − log π`; `exp` is the
    /// exponential the caller computes with (the fused engines pass their vectorizable one).
    #[inline(always)]
    pub fn kl_term(
        estimator: crate::config::KlEstimator,
        lp: f32,
        rf: f32,
        beta: f32,
        exp: impl Fn(f32) -> f32,
    ) -> (f32, f32) {
        use crate::config::KlEstimator;
        match estimator {
            KlEstimator::K1 => (lp - rf, beta),
            KlEstimator::K2 => {
                let delta = rf - lp;
                (delta * delta / 2.0, -beta * delta)
            }
            KlEstimator::K3 => {
                let e = exp(rf - lp);
                (e - (rf - lp) - 1.0, beta * (1.0 - e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_clip_and_kl_hand_values() {
        use reference::*;
        assert!((ratio(-1.0, -1.5) - 0.5f32.exp()).abs() < 1e-6);
        // ρ = 1.5, A = 2: clipped at 1.28 → −2.56; A = −2: min(−3, −2.56) = −3 → 3
        assert!((clipped_token_loss(1.5, 2.0, 0.2, 0.28) + 2.56).abs() < 1e-6);
        assert!((clipped_token_loss(1.5, -2.0, 0.2, 0.28) - 3.0).abs() < 1e-6);
        // ρ = 0.5, A = −1: clipped at 0.8 → min(−0.5, −0.8) = −0.8 → 0.8
        assert!((clipped_token_loss(0.5, -1.0, 0.2, 0.28) - 0.8).abs() < 1e-6);
        // Δ = ln 2: k1 = −ln2, k2 = ln²2/2, k3 = 2 − ln2 − 1
        let (k1, k2, k3) = kl(-2.0, -2.0 + 2f32.ln());
        let l2 = 2f32.ln();
        assert!(
            (k1 + l2).abs() < 1e-6
                && (k2 - l2 * l2 / 2.0).abs() < 1e-6
                && (k3 - (1.0 - l2)).abs() < 1e-6
        );
        // k3 ≥ 0 always, and 0 at Δ = 0.
        assert_eq!(kl(-1.0, -1.0).2, 0.0);
    }

    #[test]
    fn derivatives_match_finite_differences() {
        use reference::*;
        let h = 1e-3f32;
        for mode in [LossMode::Naive, LossMode::Unclipped, LossMode::Clipped] {
            for (lp, old, a) in [
                (-1.0f32, -1.1, 0.7),
                (-0.5, -1.5, 1.3),
                (-2.0, -0.9, -0.8),
                (-1.0, -1.0, -2.0),
            ] {
                let f = |x: f32| pg_term(mode, a, (x - old).exp(), x, 0.8, 1.28).0;
                let numeric = (f(lp + h) - f(lp - h)) / (2.0 * h);
                let (_, d) = pg_term(mode, a, (lp - old).exp(), lp, 0.8, 1.28);
                assert!(
                    (numeric - d).abs() < 2e-2,
                    "{mode:?} {lp} {old} {a}: {numeric} vs {d}"
                );
            }
        }
        for est in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
            let (lp, rf) = (-1.2f32, -0.7);
            let f = |x: f32| kl_term(est, x, rf, 1.0, f32::exp).0;
            let numeric = (f(lp + h) - f(lp - h)) / (2.0 * h);
            let (_, d) = kl_term(est, lp, rf, 1.0, f32::exp);
            assert!((numeric - d).abs() < 1e-2, "{est:?}: {numeric} vs {d}");
        }
        let _ = LossAggMode::TokenMean;
    }
}
