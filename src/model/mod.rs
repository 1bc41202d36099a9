//! Policies on burn, behind one interface (`Policy`) so every trainer feature works with
//! either: the lecture's per-position model and a small causal transformer.

pub mod lecture;
pub mod transformer;

pub use lecture::LecturePolicy;
pub use transformer::{TransformerPolicy, TransformerShape};

use crate::config::{ModelKind, RunConfig};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};

/// The policy being trained.
#[derive(Module, Debug)]
pub enum Policy {
    /// Answers all `n` positions at once, independently (CS336 lecture 17).
    Lecture(LecturePolicy),
    /// Answers token by token until `<eos>` or `max_len`.
    Transformer(TransformerPolicy),
}

/// The transformer's shape for a config (validated before this is called).
pub fn transformer_shape(c: &RunConfig) -> TransformerShape {
    let m = &c.model;
    TransformerShape {
        vocab: c.task.vocab + 1,
        context: m.context,
        d_model: m.d_model,
        heads: m.heads,
        layers: m.layers,
        d_ff: if m.d_ff == 0 { 4 * m.d_model } else { m.d_ff },
    }
}

/// What the policy's autoregressive generation produced, one row per response.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// Each response's tokens, `<eos>` (= `task.vocab`) included when it closed.
    pub rows: Vec<Vec<u32>>,
    /// Whether each response ended with `<eos>` within `max_len` (else it was truncated).
    pub closed: Vec<bool>,
}

impl Policy {
    pub fn new(c: &RunConfig, device: &Device) -> Self {
        let (t, m, seed) = (&c.task, &c.model, c.run.seed);
        match m.kind {
            ModelKind::Lecture => Policy::Lecture(LecturePolicy::new(
                t.vocab,
                t.n,
                m.d_model,
                m.init_scale,
                seed,
                device,
            )),
            ModelKind::Transformer => Policy::Transformer(TransformerPolicy::new(
                transformer_shape(c),
                m.init_scale,
                seed,
                device,
            )),
        }
    }

    pub fn is_autoregressive(&self) -> bool {
        matches!(self, Policy::Transformer(_))
    }

    /// A real copy of the weights (fresh tensors and parameter ids), detached: the reference.
    pub fn snapshot(&self, device: &Device) -> Self {
        struct DeepCopy<'a>(&'a Device);
        impl ModuleMapper for DeepCopy<'_> {
            fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
                Param::from_tensor(Tensor::from_data(p.val().into_data(), self.0))
            }
        }
        self.clone().map(&mut DeepCopy(device)).no_grad()
    }

    /// `Σ ‖∇‖²` over every parameter, as a one-element tensor (no read-back).
    pub fn grad_norm_sq(&self, grads: &GradientsParams, device: &Device) -> Tensor<1> {
        struct Sq<'a> {
            grads: &'a GradientsParams,
            acc: Tensor<1>,
        }
        impl ModuleVisitor for Sq<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                if let Some(g) = self.grads.get::<D>(p.id) {
                    let s = g.powi_scalar(2).sum().reshape([1]);
                    self.acc = self.acc.clone().add(s);
                }
            }
        }
        let mut v = Sq {
            grads,
            acc: Tensor::zeros([1], device),
        };
        self.visit(&mut v);
        v.acc
    }

    /// Every gradient times `factor` (global-norm clipping).
    pub fn scale_grads(&self, mut grads: GradientsParams, factor: f32) -> GradientsParams {
        struct Scale<'a>(&'a mut GradientsParams, f32);
        impl ModuleVisitor for Scale<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                if let Some(g) = self.0.remove::<D>(p.id) {
                    self.0.register(p.id, g.mul_scalar(self.1));
                }
            }
        }
        self.visit(&mut Scale(&mut grads, factor));
        grads
    }

    /// Per-token `log π` and entropy of given responses, teacher-forced:
    /// `prompts [B, n]`, `responses [B, G, T]` → (`[B, G, T]`, `[B, G, T]`), at `temperature`;
    /// over the sampler's `support [B·G·T]` when given (`sampling.keep_sampling_mask`).
    pub fn score(
        &self,
        prompts: Tensor<2, Int>,
        responses: Tensor<3, Int>,
        temperature: f32,
        support: Option<&[u64]>,
    ) -> (Tensor<3>, Tensor<3>) {
        let (logp, entropy) = self.score_with(prompts, responses, temperature, support, true);
        (logp, entropy.expect("asked for"))
    }

    /// [`Self::score`]'s `log π` alone: the entropy's kernels are not queued (log π_old,
    /// log π_ref and the cold start read no entropy).
    pub fn log_probs(
        &self,
        prompts: Tensor<2, Int>,
        responses: Tensor<3, Int>,
        temperature: f32,
        support: Option<&[u64]>,
    ) -> Tensor<3> {
        self.score_with(prompts, responses, temperature, support, false)
            .0
    }

    fn score_with(
        &self,
        prompts: Tensor<2, Int>,
        responses: Tensor<3, Int>,
        temperature: f32,
        support: Option<&[u64]>,
        entropy: bool,
    ) -> (Tensor<3>, Option<Tensor<3>>) {
        let [b, g, t] = responses.dims();
        match self {
            Policy::Lecture(m) => {
                let mut logits = m.forward(prompts); // [B, n, V]
                if let Some(s) = support {
                    // A prompt's G responses were drawn from the same rows: the first one's.
                    logits = support_bias(logits, |bi, p| s[bi * g * t + p]);
                }
                let ent = entropy.then(|| {
                    token_entropy(logits.clone().div_scalar(temperature))
                        .reshape([b, 1, t])
                        .expand([b, g, t])
                });
                (token_log_probs(logits, responses, temperature), ent)
            }
            Policy::Transformer(m) => {
                let n = prompts.dims()[1];
                let r = b * g;
                let prompts = prompts.reshape([b, 1, n]).expand([b, g, n]).reshape([r, n]);
                let resp = responses.reshape([r, t]);
                let input = if t > 1 {
                    Tensor::cat(vec![prompts, resp.clone().narrow(1, 0, t - 1)], 1)
                } else {
                    prompts
                };
                let mut logits = m.forward(input).narrow(1, n - 1, t).div_scalar(temperature); // [R, T, V]
                if let Some(s) = support {
                    logits = support_bias(logits, |ri, p| s[ri * t + p]);
                }
                let ent = entropy.then(|| token_entropy(logits.clone()).reshape([b, g, t]));
                let logp = token_log_probs(logits, resp.reshape([r, 1, t]), 1.0).reshape([b, g, t]);
                (logp, ent)
            }
        }
    }

    /// Next-token logits of the transformer for every row of `seqs [R, S]`: `[R, V]`.
    fn next_logits(m: &TransformerPolicy, seqs: Tensor<2, Int>) -> Tensor<2> {
        let [r, s] = seqs.dims();
        let v = m.vocab();
        m.forward(seqs).narrow(1, s - 1, 1).reshape([r, v])
    }

    /// Autoregressive generation, `G` responses per prompt, token by token until `<eos>` or
    /// `max_len`. `pick(logits [R·V], t)` chooses the next token of every row (a sampler or
    /// argmax). Rows that have closed keep `<eos>` as padding and are ignored.
    ///
    /// Each step recomputes the whole prefix instead of keeping a KV cache: at these context
    /// lengths (≤ a few dozen tokens) a step costs dispatches, not arithmetic, so a cache
    /// would save FLOPs that are not the bottleneck while adding state to keep equal to the
    /// teacher-forced pass; recomputing makes "autoregressive = teacher-forced" hold exactly.
    pub fn generate<E>(
        &self,
        prompts: &[&Vec<u32>],
        g: usize,
        max_len: usize,
        device: &Device,
        mut pick: impl FnMut(&[f32], usize) -> Result<Vec<u32>, E>,
    ) -> Result<Generated, E> {
        let Policy::Transformer(m) = self else {
            panic!("generate() is for autoregressive policies")
        };
        let eos = (m.vocab() - 1) as u32;
        let n = prompts.first().map(|p| p.len()).unwrap_or(0);
        let r = prompts.len() * g;
        let mut seqs: Vec<Vec<i64>> = (0..r)
            .map(|i| prompts[i / g].iter().map(|&x| x as i64).collect())
            .collect();
        let mut rows: Vec<Vec<u32>> = vec![Vec::with_capacity(max_len); r];
        let mut closed = vec![false; r];
        for t in 0..max_len {
            if closed.iter().all(|c| *c) {
                break;
            }
            let flat: Vec<i64> = seqs.iter().flatten().copied().collect();
            let input = Tensor::<2, Int>::from_data(TensorData::new(flat, [r, n + t]), device);
            let logits: Vec<f32> = Self::next_logits(m, input)
                .into_data()
                .try_to_vec::<f32>()
                .expect("f32 logits");
            let next = pick(&logits, t)?;
            for i in 0..r {
                let tok = if closed[i] { eos } else { next[i] };
                seqs[i].push(tok as i64);
                if !closed[i] {
                    rows[i].push(tok);
                    closed[i] = tok == eos;
                }
            }
        }
        Ok(Generated { rows, closed })
    }
}

/// The keep-sampling-mask on logits `[X, T, V]`: every token off row `(x, t)`'s support
/// (`bits(x, t)`, bit `j` for token `j`) at `OUTSIDE_SUPPORT`, as an added constant (its
/// gradient is the softmax's, 0 there).
fn support_bias(logits: Tensor<3>, bits: impl Fn(usize, usize) -> u64) -> Tensor<3> {
    let [x, t, v] = logits.dims();
    let mut bias = vec![0.0f32; x * t * v];
    for (r, row) in bias.chunks_exact_mut(v).enumerate() {
        crate::objective::sampling::keep_support(row, bits(r / t, r % t));
    }
    let device = logits.device();
    logits.add(Tensor::from_data(TensorData::new(bias, [x, t, v]), &device))
}

/// Entropy of the softmax of each position: `logits [X, T, V]` → `[X, T]`.
pub fn token_entropy(logits: Tensor<3>) -> Tensor<2> {
    let [x, t, _] = logits.dims();
    let logp = log_softmax(logits, 2);
    logp.clone()
        .exp()
        .mul(logp)
        .sum_dim(2)
        .neg()
        .reshape([x, t])
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn t3(v: Vec<f32>, s: [usize; 3]) -> Tensor<3> {
        Tensor::from_data(TensorData::new(v, s), &Device::flex())
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
