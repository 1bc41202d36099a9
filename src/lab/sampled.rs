//! The gradient lab on the transformer: answers drawn token by token (the fused engine's KV
//! cache and the rollout's own counter-based sampler), objectives' gradients from the fused
//! engine's backward, and a large-sample truth with its standard error — the response space
//! (`(V+1)^max_len`) cannot be enumerated, so the lab says `"exact": false`.
//!
//! The truth's `∇J` is `(1/P) Σ_x E_y[(R − b)·∇log π(y|x)]` over every training prompt, with
//! `K` answers per prompt in each of 8 independent chunks and the leave-one-out baseline `b`
//! (unbiased: `b` does not depend on the answer it weighs); its standard error comes from the
//! spread between the chunks ([`Chunks::truth`]).

use super::exact::{Chunks, Moments, Truth, add_into, k_of};
use super::study::{Ctx, Drawn, Estimator, Studied, batch_prompts};
use crate::config::RunConfig;
use crate::engine::autodiff::{blob, flat_params, load_policy};
use crate::engine::fused_transformer::{FusedTransformer, Hyper, Pick, StepInput, StepSettings};
use crate::engine::{Batch, Draw, SamplerSide};
use crate::grpo::Trainer;
use crate::model::{Policy, TransformerPolicy, transformer_shape};
use crate::objective::sampling::SamplingParams;
use crate::task::reward::score_batch;

/// The random streams of the estimators' answers (from π_θold), the KL estimators' (from π_θ)
/// and the truth's (from π_θ, one per chunk).
const OLD_STREAM: u32 = 0x006f_6c64;
const THETA_STREAM: u32 = 0x6b6c;
const TRUTH_STREAM: u32 = 0x7275_7468;
/// Rows a generation or a teacher-forced pass of the truth takes at once (its memory).
pub const ROWS: usize = 1024;

/// The transformer studied: θ's fused net (it draws from θ_old by holding θ_old's weights for
/// the draw), θ_old's and the reference's flat weights.
pub struct TransformerStudy {
    net: FusedTransformer,
    old: Vec<f32>,
    reference: Vec<f32>,
}

/// The reference's flat weights, as the trainer's engine keeps them (a checkpoint's).
pub fn reference_weights(trainer: &Trainer) -> Result<Vec<f32>, String> {
    let c = &trainer.config;
    let snapshot = trainer.engine().snapshot().map_err(|e| e.to_string())?;
    let bytes =
        blob(&snapshot, "reference.bpk").ok_or("the engine's snapshot holds no reference")?;
    let device = burn::tensor::Device::flex();
    let template = Policy::Transformer(TransformerPolicy::new(
        transformer_shape(c),
        c.model.init_scale,
        c.run.seed,
        &device,
    ));
    Ok(flat_params(
        &load_policy(template, bytes).map_err(|e| e.to_string())?,
    ))
}

/// Which weights a pass reads.
#[derive(Clone, Copy)]
enum Weights {
    Theta,
    Old,
    Reference,
}

/// Answers drawn for some prompts: the padded batch (`budget` per prompt), each row's tokens
/// and `log π` of the policy that drew them.
struct Answers {
    batch: Batch,
    rows: Vec<Vec<u32>>,
    logp: Vec<f32>,
}

impl TransformerStudy {
    pub fn new(c: &RunConfig, old: Vec<f32>, theta: Vec<f32>, reference: Vec<f32>) -> Self {
        let o = &c.optimizer;
        let hyper = Hyper {
            beta1: o.beta1 as f32,
            beta2: o.beta2 as f32,
            eps: o.eps as f32,
        };
        let net = FusedTransformer::new(transformer_shape(c), c.task.n, theta, hyper)
            .with_threads(c.run.threads);
        Self {
            net,
            old,
            reference,
        }
    }

    /// `f` on the net holding `which`'s weights (θ's back after).
    fn with<R>(&mut self, which: Weights, f: impl FnOnce(&mut FusedTransformer) -> R) -> R {
        let other = match which {
            Weights::Theta => return f(&mut self.net),
            Weights::Old => &mut self.old,
            Weights::Reference => &mut self.reference,
        };
        std::mem::swap(&mut self.net.w, other);
        let out = f(&mut self.net);
        std::mem::swap(&mut self.net.w, other);
        out
    }

    /// `per` answers to each of the prompts `xs` from π_`which` at the run's temperature, under
    /// random stream `stream` (counter-based: the same stream draws the same answers).
    fn draw(
        &mut self,
        ctx: &Ctx,
        which: Weights,
        xs: &[usize],
        per: usize,
        stream: u32,
    ) -> Answers {
        let c = ctx.config;
        let prompts: Vec<u32> = xs.iter().flat_map(|&x| ctx.prompts[x].clone()).collect();
        let draw = Draw {
            params: SamplingParams::of(&c.sampling),
            seed: c.run.seed,
            stream,
            sampler: SamplerSide::default(),
        };
        let temperature = c.sampling.temperature as f32;
        let max_len = c.max_len();
        let generation = self.with(which, |net| {
            net.generate(
                &prompts,
                per,
                max_len,
                &Pick::Sample(draw),
                temperature,
                false,
            )
        });
        let eos = c.task.vocab as u32;
        Answers {
            batch: Batch::padded(prompts, c.task.n, &generation.rows, per, eos),
            rows: generation.rows,
            logp: generation.logp,
        }
    }

    /// `log π_which` of every token of `batch` at the run's temperature (padding: 0).
    fn token_logp(&mut self, ctx: &Ctx, which: Weights, batch: &Batch) -> Vec<f32> {
        let temperature = ctx.config.sampling.temperature as f32;
        self.with(which, |net| net.batch_logp(None, batch, temperature))
    }

    /// Each answer's reward under the run's reward (verifiers, format and length terms).
    fn rewards(ctx: &Ctx, xs: &[usize], a: &Answers) -> Vec<f32> {
        let prompts: Vec<&[u32]> = xs.iter().map(|&x| ctx.prompts[x].as_slice()).collect();
        score_batch(ctx.reward, ctx.config, &prompts, &a.rows, a.batch.g).0
    }

    /// The prompts of batch `batch` (the config's batch of the training prompts, as the
    /// lecture's lab chooses them).
    fn batch_prompts(ctx: &Ctx, batch: usize) -> Vec<usize> {
        batch_prompts(ctx.config, ctx.prompts.len(), batch)
    }
}

/// A stream of its own for each batch (or chunk) under a lab stream.
fn stream_of(seed: u64, lab: u32, k: usize) -> u32 {
    crate::rng::counter_u32(seed, &[lab, k as u32])
}

/// The input of a teacher-forced pass over answers `[rows·t]` (in groups of `g` under
/// `prompts`, one per group), with the objective's inputs where given.
struct Pass<'a> {
    responses: &'a [u32],
    mask: &'a [f32],
    t: usize,
}

impl<'a> Pass<'a> {
    fn of(batch: &'a Batch) -> Self {
        Self {
            responses: &batch.responses,
            mask: &batch.mask,
            t: batch.t,
        }
    }

    fn input(
        &self,
        prompts: &'a [u32],
        g: usize,
        adv: &'a [f32],
        old: &'a [f32],
        refl: &'a [f32],
    ) -> StepInput<'a> {
        StepInput {
            prompts,
            responses: self.responses,
            mask: self.mask,
            g,
            t: self.t,
            advantages: adv,
            token_advantages: None,
            old_logp: old,
            ref_logp: refl,
            sampler_logp: None,
            support: None,
        }
    }
}

impl Studied for TransformerStudy {
    fn draw_old(&mut self, ctx: &Ctx, budget: usize, batch: usize) -> Drawn {
        let chosen = Self::batch_prompts(ctx, batch);
        let stream = stream_of(ctx.config.run.seed, OLD_STREAM, batch);
        let a = self.draw(ctx, Weights::Old, &chosen, budget, stream);
        let rewards = Self::rewards(ctx, &chosen, &a);
        // The rollout's own log π is θ_old's: it drew the answers.
        let ref_logp = self.token_logp(ctx, Weights::Reference, &a.batch);
        Drawn {
            xs: chosen
                .iter()
                .flat_map(|&x| std::iter::repeat_n(x, budget))
                .collect(),
            t: a.batch.t,
            mask: a.batch.mask,
            responses: a.batch.responses,
            rewards,
            old_logp: a.logp,
            ref_logp,
        }
    }

    fn loss_gradient(&mut self, ctx: &Ctx, d: &Drawn, e: &Estimator) -> Vec<f32> {
        let g = d.xs.len() / (e.group_prompts.len() / ctx.config.task.n).max(1);
        let pass = Pass {
            responses: &d.responses,
            mask: &d.mask,
            t: d.t,
        };
        let x = pass.input(e.group_prompts, g, e.adv, &d.old_logp, &d.ref_logp);
        let settings = StepSettings {
            loss: *e.settings,
            temperature: ctx.config.sampling.temperature as f32,
            lr: 0.0,
            max_grad_norm: 0.0,
            entropy_dynamics: false,
        };
        self.net.loss_and_gradient(&x, &settings);
        self.net.gradient().to_vec()
    }

    fn kl_estimates(&mut self, ctx: &Ctx, budget: usize, batch: usize) -> [f64; 3] {
        let chosen = Self::batch_prompts(ctx, batch);
        let stream = stream_of(ctx.config.run.seed, THETA_STREAM, batch);
        let a = self.draw(ctx, Weights::Theta, &chosen, budget, stream);
        let ref_logp = self.token_logp(ctx, Weights::Reference, &a.batch);
        let mut k = [0.0f64; 3];
        let rows = a.rows.len();
        for per_answer in answer_ks(&a, &ref_logp) {
            for (acc, v) in k.iter_mut().zip(per_answer) {
                *acc += v;
            }
        }
        k.map(|x| x / rows.max(1) as f64)
    }

    /// The large-sample truth: 8 chunks, each `K = samples / (8·P)` answers (at least 2) to
    /// every one of the `P` training prompts from π_θ.
    fn truth(&mut self, ctx: &Ctx, samples: usize) -> Truth {
        const CHUNKS: usize = 8;
        let p = ctx.prompts.len();
        let per = (samples / (CHUNKS * p.max(1))).max(2);
        let prompts_at_once = (ROWS / per).max(1);
        let temperature = ctx.config.sampling.temperature as f32;
        let k = per as f64;
        let mut chunks = Chunks::default();
        let mut moments = Moments::default();
        for chunk in 0..CHUNKS {
            let (mut grad, mut j, mut kl) = (Vec::new(), 0.0f64, 0.0f64);
            let stream = stream_of(ctx.config.run.seed, TRUTH_STREAM, chunk);
            let all: Vec<usize> = (0..p).collect();
            for (slice, xs) in all.chunks(prompts_at_once).enumerate() {
                // Each slice's answers under a stream of their own within the chunk's.
                let a = self.draw(ctx, Weights::Theta, xs, per, stream_of(0, stream, slice));
                let rewards = Self::rewards(ctx, xs, &a);
                let ref_logp = self.token_logp(ctx, Weights::Reference, &a.batch);
                let t = a.batch.t;
                let mut coef = vec![0.0f32; a.batch.mask.len()];
                for (group, rs) in rewards.chunks_exact(per).enumerate() {
                    let total: f64 = rs.iter().map(|&r| r as f64).sum();
                    j += total / k;
                    for (i, &r) in rs.iter().enumerate() {
                        let row = group * per + i;
                        let baseline = (total - r as f64) / (k - 1.0);
                        let c = ((r as f64 - baseline) / (k * p as f64)) as f32;
                        for (dst, &m) in coef[row * t..(row + 1) * t]
                            .iter_mut()
                            .zip(&a.batch.mask[row * t..(row + 1) * t])
                        {
                            *dst = c * m;
                        }
                    }
                }
                for ks in answer_ks(&a, &ref_logp) {
                    kl += ks[0] / k;
                    moments.add(1.0, ks);
                }
                let x = Pass::of(&a.batch).input(&a.batch.prompts, per, &[], &[], &[]);
                add_into(
                    &mut grad,
                    &self.net.logp_gradient(&x, &coef, temperature),
                    1.0,
                );
            }
            chunks.grads.push(grad);
            chunks.js.push(j / p as f64);
            chunks.kls.push(kl / p as f64);
        }
        chunks.moments = moments;
        chunks.truth(per * CHUNKS, (CHUNKS * per * p) as f64)
    }
}

/// k1, k2, k3 of each answer of `a` (drawn from π_θ, `a.logp` its log π) against the
/// reference's `ref_logp`, over its real tokens.
fn answer_ks<'a>(a: &'a Answers, ref_logp: &'a [f32]) -> impl Iterator<Item = [f64; 3]> + 'a {
    let t = a.batch.t;
    (0..a.rows.len()).map(move |row| {
        let span = row * t..(row + 1) * t;
        k_of(
            a.batch.mask[span.clone()]
                .iter()
                .zip(&ref_logp[span.clone()])
                .zip(&a.logp[span])
                .filter(|((m, _), _)| **m != 0.0)
                .map(|((_, &r), &l)| r as f64 - l as f64),
        )
    })
}
