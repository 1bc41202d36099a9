//! The lecture policy's distribution written out. Its response positions are decoded
//! independently (GRPO-SPEC §6), so `log π(y|x) = Σ_p log π_p(y_p|x)`: one `[n, V]` table per
//! prompt holds the whole distribution, and every answer can be enumerated (`V^n` per prompt:
//! 125 on lecture17). From it, exactly: `J(θ) = mean_x Σ_y π(y|x)·R(x, y)`, its gradient
//! `∇J = mean_x Σ_y π(y|x)·R(x, y)·∇log π(y|x)` (one backward pass of the fused lecture step
//! with those per-token coefficients) and `KL(π_θ ‖ π_ref) = mean_x Σ_y π(y|x)·log(π/π_ref)`.
//! Past [`MAX_ENUMERATED`] answers per prompt, a large sample stands in (RLOO-baselined, its
//! standard error from independent chunks), and says so (`exact: false`).

use crate::engine::fused_lecture::FusedLecture;
use crate::rng::{counter_u32, unit_f32};
use crate::task::RewardFn;

/// The most answers per prompt the truth enumerates (the issue's ~10⁶).
pub const MAX_ENUMERATED: usize = 1 << 20;

/// `log π` of every token at every position of every prompt, `[P, n, V]`, in f64.
#[derive(Debug, Clone)]
pub struct Tables {
    pub prompts: usize,
    pub n: usize,
    pub v: usize,
    pub logp: Vec<f64>,
}

impl Tables {
    /// The tables of the fused lecture policy `net` at `temperature` for `prompts`.
    pub fn of(net: &FusedLecture, prompts: &[Vec<u32>], temperature: f32) -> Self {
        let flat: Vec<u32> = prompts.concat();
        let logits = net.logits(&flat);
        Self::from_logits(&logits, prompts.len(), net.n, net.vocab, temperature)
    }

    /// From `[P·n, V]` logits: a log-softmax at `temperature` per row, in f64.
    pub fn from_logits(
        logits: &[f32],
        prompts: usize,
        n: usize,
        v: usize,
        temperature: f32,
    ) -> Self {
        let mut logp = Vec::with_capacity(logits.len());
        for row in logits.chunks_exact(v) {
            let z: Vec<f64> = row.iter().map(|&x| x as f64 / temperature as f64).collect();
            let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + z.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
            logp.extend(z.iter().map(|&x| x - lse));
        }
        Self {
            prompts,
            n,
            v,
            logp,
        }
    }

    /// `log π_p(· | x)`: the `V` entries of prompt `x`, position `p`.
    pub fn row(&self, x: usize, p: usize) -> &[f64] {
        let at = (x * self.n + p) * self.v;
        &self.logp[at..at + self.v]
    }

    /// `log π(y | x)` of a whole answer.
    pub fn answer_logp(&self, x: usize, y: &[u32]) -> f64 {
        y.iter()
            .enumerate()
            .map(|(p, &t)| self.row(x, p)[t as usize])
            .sum()
    }

    /// Each token's `log π` of answers `[rows·n]` to prompt indices `xs` (one per row), f32.
    pub fn token_logp(&self, xs: &[usize], answers: &[u32]) -> Vec<f32> {
        let n = self.n;
        answers
            .chunks_exact(n)
            .zip(xs)
            .flat_map(|(y, &x)| (0..n).map(move |p| self.row(x, p)[y[p] as usize] as f32))
            .collect()
    }

    /// An answer to prompt `x` drawn from the tables, position by position, by inverse CDF on
    /// the counter-based uniforms at `(seed, stream, row, position)`: a pure function of them.
    pub fn draw(&self, x: usize, seed: u64, stream: u32, row: u32) -> Vec<u32> {
        (0..self.n)
            .map(|p| {
                let u = unit_f32(counter_u32(seed, &[stream, row, p as u32])) as f64;
                let mut acc = 0.0;
                let r = self.row(x, p);
                for (t, &lp) in r.iter().enumerate() {
                    acc += lp.exp();
                    if u < acc {
                        return t as u32;
                    }
                }
                // Rounding left `acc` a hair under 1: the last token with mass.
                r.iter().rposition(|lp| lp.is_finite()).unwrap_or(0) as u32
            })
            .collect()
    }
}

/// Answer number `m` of `V^n` (base-`V` digits, most significant first).
pub fn answer(m: usize, n: usize, v: usize) -> Vec<u32> {
    let mut y = vec![0u32; n];
    let mut rest = m;
    for slot in y.iter_mut().rev() {
        *slot = (rest % v) as u32;
        rest /= v;
    }
    y
}

/// `V^n`, or `None` past [`MAX_ENUMERATED`].
pub fn answers_per_prompt(n: usize, v: usize) -> Option<usize> {
    let mut m: usize = 1;
    for _ in 0..n {
        m = m.checked_mul(v).filter(|&m| m <= MAX_ENUMERATED)?;
    }
    Some(m)
}

/// `J = mean_x Σ_y π(y|x)·R(x, y)`, exactly (f64), by enumeration.
pub fn objective(t: &Tables, prompts: &[Vec<u32>], reward: &RewardFn) -> f64 {
    let m = answers_per_prompt(t.n, t.v).expect("enumerable");
    let mut j = 0.0;
    for (x, prompt) in prompts.iter().enumerate() {
        for k in 0..m {
            let y = answer(k, t.n, t.v);
            j += t.answer_logp(x, &y).exp() * reward.reward(prompt, &y) as f64;
        }
    }
    j / prompts.len() as f64
}

/// The truth the estimators are held to.
#[derive(Debug, Clone)]
pub struct Truth {
    /// Computed by enumeration (else a large-sample estimate).
    pub exact: bool,
    /// Answers per prompt: enumerated (`V^n`) or sampled.
    pub answers: usize,
    pub j: f64,
    pub j_se: f64,
    /// `∇J`, flat in [`FusedLecture::flat_weights`]'s order.
    pub grad: Vec<f64>,
    /// Standard error of `grad` relative to its norm (0 when exact).
    pub grad_se: f64,
    /// `KL(π_θ ‖ π_ref)` per prompt, averaged over prompts.
    pub kl: f64,
    pub kl_se: f64,
    /// Each KL estimator's (k1, k2, k3) expectation and standard deviation over one answer
    /// `y ~ π_θ` (prompts uniform): exact by enumeration (from the samples otherwise).
    pub k_moments: [(f64, f64); 3],
}

/// The three KL estimators of one answer, each summed over its tokens: `−log ρ`,
/// `½ (log ρ)²` and `ρ − 1 − log ρ`, with `ρ = π_ref/π_θ` per token.
pub fn k_estimates(theta: &Tables, reference: &Tables, x: usize, y: &[u32]) -> [f64; 3] {
    k_of(
        y.iter()
            .enumerate()
            .map(|(p, &t)| reference.row(x, p)[t as usize] - theta.row(x, p)[t as usize]),
    )
}

/// k1, k2, k3 of one answer from its tokens' `log ρ_t = log π_ref − log π_θ`, summed.
pub fn k_of(log_rhos: impl Iterator<Item = f64>) -> [f64; 3] {
    let mut k = [0.0; 3];
    for log_rho in log_rhos {
        k[0] -= log_rho;
        k[1] += 0.5 * log_rho * log_rho;
        k[2] += log_rho.exp() - 1.0 - log_rho;
    }
    k
}

/// Running first and second moments of the three estimators, weighted.
#[derive(Default)]
pub struct Moments([(f64, f64); 3]);

impl Moments {
    pub fn add(&mut self, weight: f64, k: [f64; 3]) {
        // An answer of probability 0 adds nothing, even where its ratio overflowed (0·∞).
        if weight == 0.0 {
            return;
        }
        for (m, v) in self.0.iter_mut().zip(k) {
            m.0 += weight * v;
            m.1 += weight * v * v;
        }
    }

    /// `(mean, std)` of each, given the total weight.
    fn of(&self, total: f64) -> [(f64, f64); 3] {
        self.0.map(|(s1, s2)| {
            let mean = s1 / total;
            // NaN stays NaN (`f64::max` would make it 0: "std 0.000" of an overflowed sum).
            let var = s2 / total - mean * mean;
            (mean, if var < 0.0 { 0.0 } else { var.sqrt() })
        })
    }
}

/// What the truth is computed from.
pub struct Model<'a> {
    pub net: &'a mut FusedLecture,
    pub theta: &'a Tables,
    pub reference: &'a Tables,
    pub prompts: &'a [Vec<u32>],
    pub reward: &'a RewardFn,
    pub temperature: f32,
}

/// Rows per backward pass of the enumeration.
const CHUNK_ROWS: usize = 1 << 16;

/// `J`, `∇J` and the KL exactly where the answers can be enumerated, else from `samples`
/// answers per prompt (at least 2 per chunk of 8).
pub fn truth(m: &mut Model, samples: usize, seed: u64) -> Truth {
    match answers_per_prompt(m.theta.n, m.theta.v) {
        Some(per) => enumerate(m, per),
        None => sample(m, samples.max(16), seed),
    }
}

fn enumerate(m: &mut Model, per: usize) -> Truth {
    let (n, v) = (m.theta.n, m.theta.v);
    let p_count = m.prompts.len() as f64;
    let mut grad: Vec<f64> = Vec::new();
    let (mut j, mut kl) = (0.0, 0.0);
    let mut moments = Moments::default();
    for (x, prompt) in m.prompts.iter().enumerate() {
        let mut start = 0;
        while start < per {
            let end = (start + CHUNK_ROWS).min(per);
            let mut answers = Vec::with_capacity((end - start) * n);
            let mut coef = Vec::with_capacity((end - start) * n);
            for k in start..end {
                let y = answer(k, n, v);
                let logp = m.theta.answer_logp(x, &y);
                let pi = logp.exp();
                let r = m.reward.reward(prompt, &y) as f64;
                j += pi * r;
                kl += pi * (logp - m.reference.answer_logp(x, &y));
                moments.add(pi, k_estimates(m.theta, m.reference, x, &y));
                coef.extend(std::iter::repeat_n((pi * r / p_count) as f32, n));
                answers.extend(y);
            }
            let g = m.net.logp_gradient(prompt, &answers, &coef, m.temperature);
            add_into(&mut grad, &g, 1.0);
            start = end;
        }
    }
    Truth {
        exact: true,
        answers: per,
        j: j / p_count,
        j_se: 0.0,
        grad,
        grad_se: 0.0,
        kl: kl / p_count,
        kl_se: 0.0,
        k_moments: moments.of(p_count),
    }
}

/// The large-sample stand-in: 8 independent chunks of `samples/8` answers per prompt, each an
/// RLOO-baselined estimate of `∇J` (unbiased, low variance); their mean and its standard error.
fn sample(m: &mut Model, samples: usize, seed: u64) -> Truth {
    const CHUNKS: usize = 8;
    let per_chunk = (samples / CHUNKS).max(2);
    let p_count = m.prompts.len() as f64;
    let (mut grads, mut js, mut kls) = (Vec::new(), Vec::new(), Vec::new());
    let mut moments = Moments::default();
    for c in 0..CHUNKS {
        let mut g: Vec<f64> = Vec::new();
        let (mut j, mut kl) = (0.0, 0.0);
        for (x, prompt) in m.prompts.iter().enumerate() {
            let rows: Vec<Vec<u32>> = (0..per_chunk)
                .map(|i| {
                    m.theta
                        .draw(x, seed, 0x7275_7468 ^ c as u32, (x * per_chunk + i) as u32)
                })
                .collect();
            let rewards: Vec<f64> = rows
                .iter()
                .map(|y| m.reward.reward(prompt, y) as f64)
                .collect();
            let total: f64 = rewards.iter().sum();
            let k = per_chunk as f64;
            let mut coef = Vec::with_capacity(per_chunk * m.theta.n);
            for (y, &r) in rows.iter().zip(&rewards) {
                let baseline = (total - r) / (k - 1.0);
                coef.extend(std::iter::repeat_n(
                    ((r - baseline) / (k * p_count)) as f32,
                    y.len(),
                ));
                kl += (m.theta.answer_logp(x, y) - m.reference.answer_logp(x, y)) / k;
                moments.add(1.0, k_estimates(m.theta, m.reference, x, y));
            }
            j += total / k;
            let answers: Vec<u32> = rows.concat();
            add_into(
                &mut g,
                &m.net.logp_gradient(prompt, &answers, &coef, m.temperature),
                1.0,
            );
        }
        grads.push(g);
        js.push(j / p_count);
        kls.push(kl / p_count);
    }
    Chunks {
        grads,
        js,
        kls,
        moments,
    }
    .truth(
        per_chunk * CHUNKS,
        (CHUNKS * per_chunk * m.prompts.len()) as f64,
    )
}

/// A large-sample truth's independent chunks: each chunk's ∇J, J and KL estimates, and the
/// k1/k2/k3 moments over every answer.
#[derive(Default)]
pub struct Chunks {
    pub grads: Vec<Vec<f64>>,
    pub js: Vec<f64>,
    pub kls: Vec<f64>,
    pub moments: Moments,
}

impl Chunks {
    /// The truth: the chunks' means, their standard errors from the spread between chunks.
    /// `answers`: per prompt; `total`: every answer drawn.
    pub fn truth(self, answers: usize, total: f64) -> Truth {
        let chunks = self.grads.len() as f64;
        let (j, j_se) = mean_se(&self.js);
        let (kl, kl_se) = mean_se(&self.kls);
        let mean: Vec<f64> = (0..self.grads[0].len())
            .map(|i| self.grads.iter().map(|g| g[i]).sum::<f64>() / chunks)
            .collect();
        let spread: f64 = self
            .grads
            .iter()
            .map(|g| {
                g.iter()
                    .zip(&mean)
                    .map(|(a, b)| (a - b).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>()
            / (chunks * (chunks - 1.0));
        Truth {
            exact: false,
            answers,
            j,
            j_se,
            grad_se: spread.sqrt() / norm(&mean).max(f64::MIN_POSITIVE),
            grad: mean,
            kl,
            kl_se,
            k_moments: self.moments.of(total),
        }
    }
}

/// `acc += scale·g` (sized on first use).
pub fn add_into(acc: &mut Vec<f64>, g: &[f32], scale: f64) {
    if acc.is_empty() {
        acc.resize(g.len(), 0.0);
    }
    for (a, &x) in acc.iter_mut().zip(g) {
        *a += scale * x as f64;
    }
}

pub fn norm(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Mean and (sample) standard deviation.
pub fn mean_std(xs: &[f64]) -> (f64, f64) {
    let (mean, se) = mean_se(xs);
    (mean, se * (xs.len() as f64).sqrt())
}

/// Mean and standard error of the mean.
pub fn mean_se(xs: &[f64]) -> (f64, f64) {
    let k = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / k;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0);
    (mean, (var / k).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunConfig;
    use crate::model::lecture::LectureWeights;

    fn lecture17() -> (RunConfig, FusedLecture) {
        let c = RunConfig::preset("lecture17").unwrap();
        let (v, n, d) = (c.task.vocab, c.task.n, c.model.d_model);
        let w = LectureWeights::init(v, n, d, c.model.init_scale, 7);
        (c.clone(), FusedLecture::new(&w, v, n, d, &c))
    }

    /// An answer of probability 0 adds nothing even where its k3 overflowed (0·∞ made every
    /// moment NaN), and a NaN spread stays NaN (it printed as std 0).
    #[test]
    fn moments_skip_impossible_answers_and_keep_nan() {
        let mut m = Moments::default();
        m.add(0.5, [1.0, 2.0, 3.0]);
        m.add(0.0, [f64::INFINITY; 3]);
        m.add(0.5, [3.0, 2.0, 1.0]);
        let [(m1, s1), (m2, s2), _] = m.of(1.0);
        assert_eq!((m1, s1, m2, s2), (2.0, 1.0, 2.0, 0.0));
        let mut m = Moments::default();
        m.add(1.0, [f64::NAN; 3]);
        assert!(m.of(1.0).iter().all(|(a, b)| a.is_nan() && b.is_nan()));
    }

    /// The enumerated ∇J is the derivative of the enumerated J: central differences along
    /// random directions, in f64 tables from the perturbed f32 weights.
    #[test]
    fn the_exact_gradient_is_the_derivative_of_the_exact_objective() {
        let (c, mut net) = lecture17();
        let prompts = c.task.prompts.clone();
        let reward = RewardFn::from_task(&c.task);
        let t = 1.0;
        let theta = Tables::of(&net, &prompts, t);
        let truth = truth(
            &mut Model {
                net: &mut net.clone(),
                theta: &theta,
                reference: &theta,
                prompts: &prompts,
                reward: &reward,
                temperature: t,
            },
            0,
            0,
        );
        assert!(truth.exact && truth.answers == 125);
        assert!((truth.j - objective(&theta, &prompts, &reward)).abs() < 1e-12);
        assert!(truth.kl.abs() < 1e-12, "KL to itself");
        let w0 = net.flat_weights();
        let mut rng = crate::rng::SplitMix64::new(3);
        for _ in 0..3 {
            let u: Vec<f64> = (0..w0.len()).map(|_| rng.normal()).collect();
            let un = norm(&u);
            let eps = 1e-3;
            let j_at = |net: &mut FusedLecture, s: f64| {
                let w: Vec<f32> = w0
                    .iter()
                    .zip(&u)
                    .map(|(&w, &d)| (w as f64 + s * d / un) as f32)
                    .collect();
                net.set_flat_weights(&w);
                objective(&Tables::of(net, &prompts, t), &prompts, &reward)
            };
            let fd = (j_at(&mut net, eps) - j_at(&mut net, -eps)) / (2.0 * eps);
            let analytic = dot(&truth.grad, &u) / un;
            assert!(
                (fd - analytic).abs() < 1e-4 + 1e-3 * analytic.abs(),
                "finite difference {fd} vs ∇J·u {analytic}"
            );
        }
    }
}
