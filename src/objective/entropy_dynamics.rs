//! The entropy mechanism (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
//! Reasoning Language Models", arXiv 2505.22617), as formulas.
//!
//! For a softmax policy whose logits move by δz, the entropy of a state changes, to first
//! order, by `δH = −Cov_{a∼π}(log π(a), δz_a)` (∂H/∂z_a = −π_a (log π_a + H)). Their law
//! specialises δz to the update of a *tabular* softmax: `δz = η·π·A` for the policy gradient
//! (δH ≈ −η·Cov(log π, π·A)) and `δz = η·A` for the natural policy gradient
//! (δH ≈ −η·Cov(log π, A)). grpo-lab's `entropy/predicted_delta` is the natural-gradient form,
//! `−η·Cov(log π, A)` with η the learning rate and the covariance taken, as the paper's
//! Clip-Cov and KL-Cov take it, over the batch's real tokens (`Covariance`): Adam and a
//! parametrised (not tabular) policy are outside the law, so it predicts the sign and the
//! trend, not the size (the step's actual first-order change is `entropy/first_order_delta`).

/// The batch covariance of `log π` and `A` over real tokens, and its centre.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Covariance {
    pub mean_adv: f64,
    pub mean_logp: f64,
    /// `mean_t (A_t − mean A)(log π_t − mean log π)` over the real tokens.
    pub cov: f64,
}

impl Covariance {
    /// Over the real tokens (`mask ≠ 0`) of `logp` and per-token advantages `adv` (the
    /// shortest length of the three); `None` without a real token.
    pub fn of(logp: &[f32], adv: &[f32], mask: &[f32]) -> Option<Self> {
        let real = || {
            logp.iter()
                .zip(adv)
                .zip(mask)
                .filter(|(_, m)| **m != 0.0)
                .map(|((&l, &a), _)| (l as f64, a as f64))
        };
        let n = real().count() as f64;
        if n == 0.0 {
            return None;
        }
        let mean_logp = real().map(|(l, _)| l).sum::<f64>() / n;
        let mean_adv = real().map(|(_, a)| a).sum::<f64>() / n;
        let cov = real()
            .map(|(l, a)| (a - mean_adv) * (l - mean_logp))
            .sum::<f64>()
            / n;
        Some(Self {
            mean_adv,
            mean_logp,
            cov,
        })
    }

    /// One token's term `(A_t − mean A)(log π_t − mean log π)`: positive terms (a likely token
    /// with a better-than-average advantage, an unlikely one with a worse) lower the entropy.
    pub fn term(&self, logp: f32, adv: f32) -> f32 {
        ((adv as f64 - self.mean_adv) * (logp as f64 - self.mean_logp)) as f32
    }
}

/// `∇θH·Δθ`: the first-order entropy change of an update from `before` to `after` (flat
/// weights) along `dh = ∇θH` at `before`, summed in f64.
pub fn first_order(after: &[f32], before: &[f32], dh: &[f32]) -> f64 {
    after
        .iter()
        .zip(before)
        .zip(dh)
        .map(|((&w, &w0), &g)| (w - w0) as f64 * g as f64)
        .sum()
}

/// The law's natural-gradient prediction of a step's entropy change: `−η·Cov(log π, A)`.
pub fn predicted_delta(lr: f64, c: &Covariance) -> f64 {
    -lr * c.cov
}

/// `∂H/∂x` of one softmax row at temperature `1/inv_t` (`z = x·inv_t`), times `scale`, into
/// `out`: `−scale·inv_t·π_a (log π_a + H)`, with `probs` the row's softmax and `logp_of(a)` its
/// log π.
pub fn entropy_logit_gradient(
    probs: &[f32],
    logp_of: impl Fn(usize) -> f32,
    entropy: f32,
    inv_t: f32,
    scale: f32,
    out: &mut [f32],
) {
    for (a, (o, &p)) in out.iter_mut().zip(probs).enumerate() {
        *o = -scale * inv_t * p * (logp_of(a) + entropy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_covariance_from_its_definition() {
        // Real tokens 0, 1, 3: log π −1, −2, −0.5; A 1, −1, 2 (token 2 is padding).
        let logp = [-1.0, -2.0, 9.0, -0.5];
        let adv = [1.0, -1.0, 7.0, 2.0];
        let mask = [1.0, 1.0, 0.0, 1.0];
        let c = Covariance::of(&logp, &adv, &mask).unwrap();
        let (ml, ma) = (-3.5 / 3.0, 2.0 / 3.0);
        let want =
            ((1.0 - ma) * (-1.0 - ml) + (-1.0 - ma) * (-2.0 - ml) + (2.0 - ma) * (-0.5 - ml)) / 3.0;
        assert!((c.cov - want).abs() < 1e-12, "{} vs {want}", c.cov);
        assert!((c.term(-0.5, 2.0) as f64 - (2.0 - ma) * (-0.5 - ml)).abs() < 1e-6);
        assert!((predicted_delta(0.1, &c) + 0.1 * want).abs() < 1e-12);
        assert!(Covariance::of(&logp, &adv, &[0.0; 4]).is_none());
    }

    /// ∂H/∂x against central differences of the row's entropy, at T = 0.7.
    #[test]
    fn the_entropy_gradient_is_the_derivative_of_the_entropy() {
        let x = [0.3f64, -1.2, 2.0, 0.1];
        let inv_t = 1.0 / 0.7;
        let h = |x: &[f64]| {
            let z: Vec<f64> = x.iter().map(|v| v * inv_t).collect();
            let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
            -z.iter().map(|v| (v - lse).exp() * (v - lse)).sum::<f64>()
        };
        let z: Vec<f64> = x.iter().map(|v| v * inv_t).collect();
        let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
        let logp: Vec<f32> = z.iter().map(|v| (v - lse) as f32).collect();
        let probs: Vec<f32> = logp.iter().map(|l| l.exp()).collect();
        let mut g = [0.0f32; 4];
        entropy_logit_gradient(&probs, |a| logp[a], h(&x) as f32, inv_t as f32, 1.0, &mut g);
        for a in 0..4 {
            let mut up = x;
            let mut down = x;
            up[a] += 1e-5;
            down[a] -= 1e-5;
            let fd = (h(&up) - h(&down)) / 2e-5;
            assert!((fd - g[a] as f64).abs() < 1e-4, "{a}: {fd} vs {}", g[a]);
        }
    }
}
