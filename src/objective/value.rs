//! PPO's learned critic — what GRPO removes (seeds §2–3): a small value model and GAE.
//!
//! `V(s_t)` is the value of the state before response token `t`: the prompt, the tokens so far
//! and the position, one-hot, through one tanh layer of `hidden` units to a scalar. It is a
//! model of its own (not a head on the policy), trained on the host by regression on each
//! iteration's returns (Adam, full batch, `value_epochs` steps), so every engine gets the same
//! critic. The advantages are GAE(γ, λ) per token over a reward paid at the last token,
//! whitened over the batch's real tokens (as TRL's PPO and verl's GAE do).

use crate::rng::SplitMix64;
use crate::task::batch::Batch;

/// The critic: one hidden tanh layer over one-hot features of the state.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueModel {
    /// Prompt length, number tokens, longest response, hidden units.
    n: usize,
    vocab: usize,
    max_len: usize,
    hidden: usize,
    /// `[W1 (features × hidden), b1 (hidden), w2 (hidden), b2]`
    params: Vec<f32>,
    /// Adam's moments and step count.
    m: Vec<f32>,
    v: Vec<f32>,
    step: i32,
}

impl ValueModel {
    /// `vocab` numbers (the response's `<eos>` is token `vocab`), answers of at most `max_len`.
    pub fn new(n: usize, vocab: usize, max_len: usize, hidden: usize, seed: u64) -> Self {
        let features = n * vocab + max_len * (vocab + 1) + max_len;
        let len = features * hidden + 2 * hidden + 1;
        let mut rng = SplitMix64::for_stream(seed, "critic");
        let mut params = vec![0f32; len];
        // W1 small; w2 small; biases 0: V ≈ 0 at the start.
        for p in &mut params[..features * hidden] {
            *p = 0.1 * rng.normal() as f32;
        }
        let w2 = features * hidden + hidden;
        for p in &mut params[w2..w2 + hidden] {
            *p = 0.1 * rng.normal() as f32;
        }
        Self {
            n,
            vocab,
            max_len,
            hidden,
            m: vec![0.0; len],
            v: vec![0.0; len],
            step: 0,
            params,
        }
    }

    /// Trainable parameters.
    pub fn parameters(&self) -> usize {
        self.params.len()
    }

    /// The parameters a critic of this shape has (for estimates before one exists).
    pub fn parameter_count(n: usize, vocab: usize, max_len: usize, hidden: usize) -> usize {
        (n * vocab + max_len * (vocab + 1) + max_len) * hidden + 2 * hidden + 1
    }

    fn features(&self) -> usize {
        self.n * self.vocab + self.max_len * (self.vocab + 1) + self.max_len
    }

    /// The active one-hot features of the state before token `t` of `response` to `prompt`.
    fn active(&self, prompt: &[u32], response: &[u32], t: usize, out: &mut Vec<usize>) {
        out.clear();
        for (i, &p) in prompt.iter().enumerate().take(self.n) {
            out.push(i * self.vocab + (p as usize).min(self.vocab - 1));
        }
        let base = self.n * self.vocab;
        for (j, &y) in response.iter().enumerate().take(t.min(self.max_len)) {
            out.push(base + j * (self.vocab + 1) + (y as usize).min(self.vocab));
        }
        out.push(base + self.max_len * (self.vocab + 1) + t.min(self.max_len - 1));
    }

    /// `V` and the hidden activations of one state.
    fn forward(&self, active: &[usize], h: &mut [f32]) -> f32 {
        let (f, hd) = (self.features(), self.hidden);
        let b1 = &self.params[f * hd..f * hd + hd];
        h.copy_from_slice(b1);
        for &idx in active {
            for (x, w) in h.iter_mut().zip(&self.params[idx * hd..(idx + 1) * hd]) {
                *x += w;
            }
        }
        let w2 = &self.params[f * hd + hd..f * hd + 2 * hd];
        let mut out = self.params[f * hd + 2 * hd];
        for (x, w) in h.iter_mut().zip(w2) {
            *x = x.tanh();
            out += *x * w;
        }
        out
    }

    /// Visits every real token's state of the batch: `(row·T + t, active features)`.
    fn states(&self, batch: &Batch, mut visit: impl FnMut(usize, &[usize])) {
        let mut active = Vec::with_capacity(self.n + self.max_len + 1);
        for (row, &len) in batch.lengths.iter().enumerate() {
            let prompt = &batch.prompts[(row / batch.g) * batch.n..(row / batch.g + 1) * batch.n];
            let response = &batch.responses[row * batch.t..(row + 1) * batch.t];
            for t in 0..len.min(batch.t) {
                self.active(prompt, response, t, &mut active);
                visit(row * batch.t + t, &active);
            }
        }
    }

    /// `V` of the state before each token, `[B·G·T]` (0 on padding).
    pub fn values(&self, batch: &Batch) -> Vec<f32> {
        let mut out = vec![0f32; batch.responses.len()];
        let mut h = vec![0f32; self.hidden];
        self.states(batch, |i, active| out[i] = self.forward(active, &mut h));
        out
    }

    /// `epochs` full-batch Adam steps of the squared error to `targets` (`[B·G·T]`, real tokens
    /// only). Returns the mean squared error before the first step.
    pub fn fit(&mut self, batch: &Batch, targets: &[f32], lr: f32, epochs: usize) -> f32 {
        let (f, hd) = (self.features(), self.hidden);
        let count = batch
            .lengths
            .iter()
            .map(|&l| l.min(batch.t))
            .sum::<usize>()
            .max(1) as f32;
        let mut first_loss = f32::NAN;
        let mut h = vec![0f32; hd];
        let mut dz = vec![0f32; hd];
        for epoch in 0..epochs.max(1) {
            let mut grad = vec![0f32; self.params.len()];
            let mut loss = 0f32;
            self.states(batch, |i, active| {
                let value = self.forward(active, &mut h);
                let err = value - targets[i];
                loss += err * err;
                let dv = 2.0 * err / count;
                grad[f * hd + 2 * hd] += dv;
                for k in 0..hd {
                    grad[f * hd + hd + k] += dv * h[k];
                    dz[k] = dv * self.params[f * hd + hd + k] * (1.0 - h[k] * h[k]);
                    grad[f * hd + k] += dz[k];
                }
                for &idx in active {
                    for (g, d) in grad[idx * hd..(idx + 1) * hd].iter_mut().zip(&dz) {
                        *g += d;
                    }
                }
            });
            if epoch == 0 {
                first_loss = loss / count;
            }
            if epoch < epochs {
                self.adam(&grad, lr);
            }
        }
        first_loss
    }

    fn adam(&mut self, grad: &[f32], lr: f32) {
        const HYPER: super::adam::Hyper = super::adam::Hyper {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        self.step += 1;
        super::adam::AdamStep::at(&HYPER, self.step, lr, 1.0).apply(
            &mut self.params,
            grad,
            &mut self.m,
            &mut self.v,
        );
    }

    /// Everything a checkpoint needs to continue exactly: parameters, Adam's moments, step.
    pub fn state(&self) -> Vec<f32> {
        let mut s = Vec::with_capacity(3 * self.params.len() + 1);
        s.extend(&self.params);
        s.extend(&self.m);
        s.extend(&self.v);
        s.push(self.step as f32);
        s
    }

    /// Back from [`Self::state`]; `false` (and unchanged) if the length does not fit.
    pub fn set_state(&mut self, s: &[f32]) -> bool {
        let p = self.params.len();
        if s.len() != 3 * p + 1 {
            return false;
        }
        self.params.copy_from_slice(&s[..p]);
        self.m.copy_from_slice(&s[p..2 * p]);
        self.v.copy_from_slice(&s[2 * p..3 * p]);
        self.step = s[3 * p] as i32;
        true
    }
}

/// GAE(γ, λ) for a reward paid at each response's last real token: per token the advantage
/// `A_t = Σ_l (γλ)^l δ_{t+l}`, `δ_t = r_t + γ V_{t+1} − V_t` (`V` after the last token is 0),
/// and the return `A_t + V_t` the critic regresses on. `[rows·T]` each, 0 on padding.
pub fn gae(
    rewards: &[f32],
    values: &[f32],
    lengths: &[usize],
    t: usize,
    gamma: f32,
    lambda: f32,
) -> (Vec<f32>, Vec<f32>) {
    let mut adv = vec![0f32; values.len()];
    let mut ret = vec![0f32; values.len()];
    for (row, (&r, &len)) in rewards.iter().zip(lengths).enumerate() {
        let len = len.min(t);
        let mut next_adv = 0f32;
        for k in (0..len).rev() {
            let i = row * t + k;
            let (reward, next_value) = if k + 1 == len {
                (r, 0.0)
            } else {
                (0.0, values[i + 1])
            };
            let delta = reward + gamma * next_value - values[i];
            next_adv = delta + gamma * lambda * next_adv;
            adv[i] = next_adv;
            ret[i] = next_adv + values[i];
        }
    }
    (adv, ret)
}

/// Shift and scale `x` to mean 0 and std 1 over the positions where `mask` is 1 (TRL's
/// `whiten`); padding stays 0.
pub fn whiten(x: &mut [f32], mask: &[f32]) {
    let n: f32 = mask.iter().sum();
    if n < 2.0 {
        return;
    }
    let mean = x.iter().zip(mask).map(|(a, m)| a * m).sum::<f32>() / n;
    let var = x
        .iter()
        .zip(mask)
        .map(|(a, m)| m * (a - mean).powi(2))
        .sum::<f32>()
        / n;
    let std = var.sqrt() + 1e-8;
    for (a, m) in x.iter_mut().zip(mask) {
        *a = if *m > 0.0 { (*a - mean) / std } else { 0.0 };
    }
}

/// `1 − Var(returns − values) / Var(returns)` over the real tokens (verl's
/// `critic/vf_explained_var`): 1 = a perfect critic, 0 = no better than a constant.
pub fn explained_variance(values: &[f32], returns: &[f32], mask: &[f32]) -> f32 {
    let n: f32 = mask.iter().sum();
    if n < 2.0 {
        return f32::NAN;
    }
    let var = |f: &dyn Fn(usize) -> f32| {
        let mean = (0..mask.len()).map(|i| mask[i] * f(i)).sum::<f32>() / n;
        (0..mask.len())
            .map(|i| mask[i] * (f(i) - mean).powi(2))
            .sum::<f32>()
            / n
    };
    let total = var(&|i| returns[i]);
    let resid = var(&|i| returns[i] - values[i]);
    if total <= 0.0 {
        return f32::NAN;
    }
    1.0 - resid / total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gae_with_lambda_one_and_gamma_one_is_reward_minus_value() {
        // One row of 3 tokens, reward 2 at the end, values 0.5, 1.0, 1.5.
        let values = [0.5f32, 1.0, 1.5, 0.0];
        let (adv, ret) = gae(&[2.0], &values, &[3], 4, 1.0, 1.0);
        assert_eq!(&adv[..3], &[1.5, 1.0, 0.5]);
        assert_eq!(&ret[..3], &[2.0, 2.0, 2.0]);
        assert_eq!(adv[3], 0.0);
        // λ = 0: one-step TD errors. δ_2 = 2 − 1.5; δ_1 = 1.5 − 1.0; δ_0 = 1.0 − 0.5.
        let (adv, _) = gae(&[2.0], &values, &[3], 4, 1.0, 0.0);
        assert_eq!(&adv[..3], &[0.5, 0.5, 0.5]);
        // γ = 0.5, λ = 1 by hand: A_2 = 2 − 1.5 = 0.5; A_1 = 0.5·1.5 − 1 + 0.5·0.5 = 0;
        // A_0 = 0.5·1 − 0.5 + 0.5·0 = 0.
        let (adv, _) = gae(&[2.0], &values, &[3], 4, 0.5, 1.0);
        assert!((adv[0]).abs() < 1e-6 && adv[1].abs() < 1e-6 && (adv[2] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn whiten_skips_padding() {
        let mut x = [1.0f32, 3.0, 100.0];
        whiten(&mut x, &[1.0, 1.0, 0.0]);
        assert!((x[0] + 1.0).abs() < 1e-5 && (x[1] - 1.0).abs() < 1e-5 && x[2] == 0.0);
    }

    fn toy_batch() -> (Batch, Vec<f32>) {
        // Two prompts × 2 responses of length 2..3; the targets are a function of the state
        // (the prompt's first number, the position, the previous token).
        let rows = vec![vec![0u32, 1, 5], vec![1, 0], vec![2, 2, 5], vec![0, 0]];
        let batch = Batch::padded(vec![0, 1, 2, 2, 1, 0], 3, &rows, 2, 5);
        let targets: Vec<f32> = (0..batch.responses.len())
            .map(|i| {
                let (row, t) = (i / batch.t, i % batch.t);
                let first = batch.prompts[(row / batch.g) * batch.n] as f32;
                let prev_zero = t > 0 && batch.responses[i - 1] == 0;
                0.3 * first - 0.25 * t as f32 + if prev_zero { 0.4 } else { 0.0 }
            })
            .collect();
        (batch, targets)
    }

    #[test]
    fn the_critic_learns_its_targets_and_its_gradient_is_right() {
        let (batch, targets) = toy_batch();
        let mut critic = ValueModel::new(3, 5, 3, 8, 7);
        // Finite differences on a few parameters of the squared error.
        let loss_of = |c: &ValueModel| {
            let v = c.values(&batch);
            let (mut s, mut n) = (0f64, 0f64);
            for (i, m) in batch.mask.iter().enumerate() {
                if *m > 0.0 {
                    s += ((v[i] - targets[i]) as f64).powi(2);
                    n += 1.0;
                }
            }
            s / n
        };
        let before = loss_of(&critic);
        let mut probe = critic.clone();
        let l0 = probe.fit(&batch, &targets, 0.0, 0);
        assert!((l0 as f64 - before).abs() < 1e-5);
        // One SGD-like check: a tiny Adam step lowers the loss.
        let mut stepped = critic.clone();
        stepped.fit(&batch, &targets, 1e-3, 1);
        assert!(loss_of(&stepped) < before);
        let l = critic.fit(&batch, &targets, 3e-2, 300);
        assert!(l.is_finite());
        assert!(loss_of(&critic) < 0.01, "{}", loss_of(&critic));
        // The state round-trips.
        let mut other = ValueModel::new(3, 5, 3, 8, 99);
        assert!(other.set_state(&critic.state()));
        assert_eq!(other, critic);
        assert!(!other.set_state(&[1.0]));
    }

    #[test]
    fn explained_variance_of_a_perfect_and_a_constant_critic() {
        let ret = [1.0f32, 2.0, 3.0];
        let mask = [1.0f32; 3];
        assert!((explained_variance(&ret, &ret, &mask) - 1.0).abs() < 1e-6);
        assert!(explained_variance(&[2.0; 3], &ret, &mask).abs() < 1e-6);
    }
}
