//! The per-token GRPO loss (GRPO-SPEC §4) on burn tensors, with plain scalar
//! references next to it for the tests.
//!
//! Shapes: `B` prompts, `G` responses per prompt, `T` response positions.

use crate::config::{KlEstimator, LossAggMode, LossMode};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};

/// `log π(token)` for every sampled token: `logits [B, T, V]`, `responses [B, G, T]`
/// → `[B, G, T]`, with the policy's temperature applied (as TRL does).
pub fn token_log_probs(
    logits: Tensor<3>,
    responses: Tensor<3, Int>,
    temperature: f32,
) -> Tensor<3> {
    let [b, g, t] = responses.dims();
    let [_, _, v] = logits.dims();
    let device = logits.device();
    let logp = log_softmax(logits.div_scalar(temperature), 2).reshape([b, t * v]); // [B, T·V]
    // Flat index of (position, token) in a row of T·V: t·V + token. Gathering B·G·T values
    // directly is far cheaper than expanding the log-probs to [B, G, T, V] first.
    let offsets = Tensor::<1, Int>::arange(0..t as i64, &device)
        .mul_scalar(v as i64)
        .reshape([1, 1, t])
        .expand([b, g, t]);
    let index = responses.add(offsets).reshape([b, g * t]); // [B, G·T]
    logp.gather(1, index).reshape([b, g, t])
}

/// Mean entropy of the policy per response position: `logits [B, T, V]` → scalar.
pub fn mean_entropy(logits: Tensor<3>, temperature: f32) -> Tensor<1> {
    let logp = log_softmax(logits.div_scalar(temperature), 2);
    logp.clone().exp().mul(logp).sum_dim(2).neg().mean()
}

/// Per-token KL estimate of `π_θ` from `π_ref`, with `Δ = log π_ref − log π_θ` (Schulman 2020).
pub fn kl_tokens(estimator: KlEstimator, logp: Tensor<3>, ref_logp: Tensor<3>) -> Tensor<3> {
    let delta = ref_logp.sub(logp);
    match estimator {
        KlEstimator::K1 => delta.neg(),
        KlEstimator::K2 => delta.powi_scalar(2).div_scalar(2.0),
        KlEstimator::K3 => delta.clone().exp().sub(delta).sub_scalar(1.0),
    }
}

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
}

/// The loss and the per-token statistics the metrics need (each a one-element tensor).
pub struct LossOutput {
    pub loss: Tensor<1>,
    pub kl: Tensor<1>,
    /// Fraction of tokens with `ρ < 1 − ε_low` and `A < 0` (their gradient is clipped away).
    pub clip_low: Tensor<1>,
    /// Fraction of tokens with `ρ > 1 + ε_high` and `A > 0`.
    pub clip_high: Tensor<1>,
    pub ratio_mean: Tensor<1>,
}

/// The GRPO objective for one optimizer step.
/// `logp`, `old_logp`, `ref_logp`, `mask`: `[B, G, T]`; `advantages`: `[B, G]`.
pub fn grpo_loss(
    s: &LossSettings,
    logp: Tensor<3>,
    old_logp: Tensor<3>,
    ref_logp: Tensor<3>,
    advantages: Tensor<2>,
    mask: Tensor<3>,
) -> LossOutput {
    let [b, g, t] = logp.dims();
    let adv = advantages.unsqueeze_dim::<3>(2).expand([b, g, t]); // [B, G, T]
    let ratio = if s.bug_ratio_quotient {
        logp.clone().div(old_logp.clone())
    } else {
        logp.clone().sub(old_logp).exp()
    };
    let per_token = match s.mode {
        LossMode::Naive => adv.clone().mul(logp.clone()).neg(),
        LossMode::Unclipped => adv.clone().mul(ratio.clone()).neg(),
        LossMode::Clipped => {
            let unclipped = ratio.clone().mul(adv.clone());
            let clipped = ratio
                .clone()
                .clamp(1.0 - s.epsilon_low, 1.0 + s.epsilon_high)
                .mul(adv.clone());
            unclipped.min_pair(clipped).neg()
        }
    };
    let kl = kl_tokens(s.kl_estimator, logp, ref_logp);
    let per_token = if s.kl_in_loss && s.beta > 0.0 {
        per_token.add(kl.clone().mul_scalar(s.beta))
    } else {
        per_token
    };
    let loss = aggregate(s.agg, per_token, mask.clone());
    let token_mean = |x: Tensor<3>| aggregate(LossAggMode::TokenMean, x, mask.clone());
    let ratio_d = ratio.clone().detach();
    let adv_d = adv.detach();
    let low = ratio_d
        .clone()
        .lower_elem(1.0 - s.epsilon_low)
        .float()
        .mul(adv_d.clone().lower_elem(0.0).float());
    let high = ratio_d
        .clone()
        .greater_elem(1.0 + s.epsilon_high)
        .float()
        .mul(adv_d.greater_elem(0.0).float());
    LossOutput {
        loss,
        kl: token_mean(kl.detach()),
        clip_low: token_mean(low),
        clip_high: token_mean(high),
        ratio_mean: token_mean(ratio_d),
    }
}

/// Token aggregation over a padding mask (1 = real token, 0 = padding). `x`, `mask`: `[B, G, T]`.
pub fn aggregate(agg: LossAggMode, x: Tensor<3>, mask: Tensor<3>) -> Tensor<1> {
    let [b, g, t] = x.dims();
    let masked = x.mul(mask.clone());
    match agg {
        // mean over each response's tokens, then over responses (GRPO paper)
        LossAggMode::SeqMeanTokenMean => {
            let per_seq = masked.sum_dim(2).div(mask.sum_dim(2).clamp_min(1.0));
            per_seq.mean()
        }
        // all tokens of the batch weigh the same (DAPO)
        LossAggMode::TokenMean => masked.sum().div(mask.sum().clamp_min(1.0)),
        // a constant normaliser: responses × max length (Dr. GRPO)
        LossAggMode::SeqMeanTokenSumNorm => masked.sum().div_scalar((b * g * t) as f32),
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

    /// `(k1, k2, k3)` for `Δ = log π_ref − log π_θ`.
    pub fn kl(logp: f32, ref_logp: f32) -> (f32, f32, f32) {
        let d = ref_logp - logp;
        (-d, d * d / 2.0, d.exp() - d - 1.0)
    }

    /// One token's `(ratio, loss, kl, flags)` exactly as `tokens` in `shaders/token_loss.wgsl`
    /// (flags: bit 0 clipped low, bit 1 clipped high).
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
        let low = (ratio < 1.0 - s.epsilon_low && adv < 0.0) as u32;
        let high = (ratio > 1.0 + s.epsilon_high && adv > 0.0) as u32;
        (ratio, loss, kl, low | (high << 1))
    }

    /// Entropy of `softmax(logits / T)` for one row, as `entropy` in `shaders/token_loss.wgsl`.
    pub fn entropy_row(logits: &[f32], temperature: f32) -> f32 {
        let m = logits.iter().fold(f32::MIN, |m, l| m.max(l / temperature));
        let z: f32 = logits.iter().map(|l| (l / temperature - m).exp()).sum();
        let log_z = z.ln();
        -logits
            .iter()
            .map(|l| {
                let lq = l / temperature - m - log_z;
                lq.exp() * lq
            })
            .sum::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    fn t3(v: Vec<f32>, s: [usize; 3]) -> Tensor<3> {
        Tensor::from_data(TensorData::new(v, s), &Device::flex())
    }
    fn scalar(x: Tensor<1>) -> f32 {
        x.into_scalar::<f32>()
    }
    fn settings(mode: LossMode) -> LossSettings {
        LossSettings {
            mode,
            epsilon_low: 0.2,
            epsilon_high: 0.28,
            beta: 0.0,
            kl_in_loss: true,
            kl_estimator: KlEstimator::K3,
            agg: LossAggMode::TokenMean,
            bug_ratio_quotient: false,
        }
    }

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
    fn tensor_loss_matches_scalar_reference() {
        let logp = vec![-1.0, -0.5, -2.0, -0.1];
        let old = vec![-1.5, -0.5, -1.0, -0.4];
        let refl = vec![-1.2, -0.7, -2.5, -0.1];
        let adv = [2.0f32, -1.0];
        let s = [1, 2, 2];
        let mask = t3(vec![1.0; 4], s);
        let a = Tensor::<2>::from_data(TensorData::new(adv.to_vec(), [1, 2]), &Device::flex());
        for mode in [LossMode::Naive, LossMode::Unclipped, LossMode::Clipped] {
            let mut st = settings(mode);
            st.beta = 0.1;
            let out = grpo_loss(
                &st,
                t3(logp.clone(), s),
                t3(old.clone(), s),
                t3(refl.clone(), s),
                a.clone(),
                mask.clone(),
            );
            let mut want = 0.0;
            let (mut lo, mut hi) = (0.0, 0.0);
            for i in 0..4 {
                let ad = adv[i / 2];
                let r = reference::ratio(logp[i], old[i]);
                want += match mode {
                    LossMode::Naive => -ad * logp[i],
                    LossMode::Unclipped => -ad * r,
                    LossMode::Clipped => reference::clipped_token_loss(r, ad, 0.2, 0.28),
                } + 0.1 * reference::kl(logp[i], refl[i]).2;
                lo += ((r < 0.8) && ad < 0.0) as i32 as f32;
                hi += ((r > 1.28) && ad > 0.0) as i32 as f32;
            }
            let got = scalar(out.loss);
            assert!(
                (got - want / 4.0).abs() < 1e-5,
                "{mode:?}: {got} vs {}",
                want / 4.0
            );
            assert_eq!(scalar(out.clip_low), lo / 4.0);
            assert_eq!(scalar(out.clip_high), hi / 4.0);
        }
    }

    #[test]
    fn aggregations_on_a_ragged_batch() {
        // two responses: lengths 1 and 3 of max 3; values 4 | 1, 2, 3 (padding holds 100).
        let x = t3(vec![4.0, 100.0, 100.0, 1.0, 2.0, 3.0], [1, 2, 3]);
        let m = t3(vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0], [1, 2, 3]);
        let agg = |a| scalar(aggregate(a, x.clone(), m.clone()));
        assert!((agg(LossAggMode::SeqMeanTokenMean) - (4.0 + 2.0) / 2.0).abs() < 1e-6);
        assert!((agg(LossAggMode::TokenMean) - 10.0 / 4.0).abs() < 1e-6);
        assert!((agg(LossAggMode::SeqMeanTokenSumNorm) - 10.0 / 6.0).abs() < 1e-6);
    }

    #[test]
    fn token_log_probs_gather_the_sampled_tokens() {
        let logits = t3(vec![0.0, 1.0, 2.0, 2.0, 0.0, 0.0], [1, 2, 3]);
        let resp = Tensor::<3, Int>::from_data(
            TensorData::new(vec![2i64, 0, 1, 2], [1, 2, 2]),
            &Device::flex(),
        );
        let lp = token_log_probs(logits, resp, 1.0)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let lse0 = (1f32 + 1f32.exp() + 2f32.exp()).ln();
        let lse1 = (2f32.exp() + 2.0).ln();
        let want = [2.0 - lse0, 2.0 - lse1, 1.0 - lse0, -lse1];
        for (g, w) in lp.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{lp:?}");
        }
    }
}
