//! The per-token GRPO loss on burn tensors (the autodiff engine's), held equal to the scalar
//! formulas of `objective::loss::reference` by its tests.
//!
//! Shapes: `B` prompts, `G` responses per prompt, `T` response positions.

use crate::config::{KlEstimator, LossAggMode, LossMode};
pub use crate::objective::loss::LossSettings;
use burn::tensor::Tensor;

/// Per-token KL estimate of `π_θ` from `π_ref`, with `Δ = log π_ref − log π_θ` (Schulman 2020).
pub fn kl_tokens(estimator: KlEstimator, logp: Tensor<3>, ref_logp: Tensor<3>) -> Tensor<3> {
    let delta = ref_logp.sub(logp);
    match estimator {
        KlEstimator::K1 => delta.neg(),
        KlEstimator::K2 => delta.powi_scalar(2).div_scalar(2.0),
        KlEstimator::K3 => delta.clone().exp().sub(delta).sub_scalar(1.0),
    }
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
    grpo_loss_per_token(s, logp, old_logp, ref_logp, adv, mask)
}

/// [`grpo_loss`] with an advantage per token, `[B, G, T]` (PPO's GAE).
pub fn grpo_loss_per_token(
    s: &LossSettings,
    logp: Tensor<3>,
    old_logp: Tensor<3>,
    ref_logp: Tensor<3>,
    adv: Tensor<3>,
    mask: Tensor<3>,
) -> LossOutput {
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
    let loss = aggregate(s.agg, per_token, mask.clone(), s.max_len);
    let token_mean = |x: Tensor<3>| aggregate(LossAggMode::TokenMean, x, mask.clone(), 0);
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
/// `max_len` is Dr. GRPO's constant: the longest a response may be (at least the padded width `T`).
pub fn aggregate(agg: LossAggMode, x: Tensor<3>, mask: Tensor<3>, max_len: usize) -> Tensor<1> {
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
        LossAggMode::SeqMeanTokenSumNorm => {
            masked.sum().div_scalar((b * g * max_len.max(t)) as f32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objective::loss::reference;
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
            max_len: 0,
        }
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
        let agg = |a| scalar(aggregate(a, x.clone(), m.clone(), 3));
        assert!((agg(LossAggMode::SeqMeanTokenMean) - (4.0 + 2.0) / 2.0).abs() < 1e-6);
        assert!((agg(LossAggMode::TokenMean) - 10.0 / 4.0).abs() < 1e-6);
        assert!((agg(LossAggMode::SeqMeanTokenSumNorm) - 10.0 / 6.0).abs() < 1e-6);
        // Dr. GRPO's normaliser is a constant: responses × max_len, even when the batch's
        // longest response (3) is shorter than max_len (8).
        let drgrpo = scalar(aggregate(
            LossAggMode::SeqMeanTokenSumNorm,
            x.clone(),
            m.clone(),
            8,
        ));
        assert!((drgrpo - 10.0 / 16.0).abs() < 1e-6, "{drgrpo}");
    }
}
