//! One GRPO run, step by step (GRPO-SPEC §2). `Trainer::step` performs one optimizer
//! step; the first step of each iteration also rolls out, scores and freezes `π_old`.
//! Nothing here blocks on anything but the device, so the app can drive it from a
//! thread and a web build from its frame loop; file I/O lives in `train`.

use crate::config::{
    AdvantageMode, FusedChoice, KernelChoice, KlPenaltyMode, LengthReward, PromptSampling,
    RunConfig,
};
use crate::gpu::Compute;
use crate::grpo::advantage::{self, GroupStats};
use crate::grpo::fused::{FusedLecture, StepScalars};
use crate::grpo::kernels::Kernels;
use crate::grpo::loss::{self, LossSettings};
use crate::grpo::sampling::{self, SamplingParams};
use crate::metrics::{GroupRecord, StepRecord};
use crate::model::Policy;
use crate::rng::{SplitMix64, counter_u32};
use crate::task::reward::{ArResponse, kimi_length_rewards, overlong_penalty};
use crate::task::sort::TaskError;
use crate::task::tokenizer::EOS_ID;
use crate::task::{PromptSet, RewardFn};
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor, TensorData};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TrainError {
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(
        "the loss became {value} at step {step} (iteration {iteration}); the run stops here, the last good checkpoint and the metrics so far are kept"
    )]
    NonFinite {
        step: usize,
        iteration: usize,
        value: f32,
    },
    #[error(transparent)]
    Kernel(#[from] crate::grpo::kernels::KernelError),
    #[error(
        "run.kernels = gpu needs a wgpu device, but the run is on {0}; use --kernels reference or --device software|gpu"
    )]
    KernelsNeedWgpu(String),
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: String, reason: String },
}

/// The frozen data of one iteration: what the `μ` optimizer steps reuse.
struct Rollout {
    /// `[B, n]`
    prompts: Tensor<2, Int>,
    /// `[B, G, T]`, `<eos>`-padded after each response's end.
    responses: Tensor<3, Int>,
    /// `[B, G]`, under the mode that drives the update.
    advantages: Tensor<2>,
    /// `log π_old`, `[B, G, T]`, computed once without gradient.
    old_logp: Tensor<3>,
    /// `log π_ref`, `[B, G, T]`.
    ref_logp: Tensor<3>,
    /// 1 for real tokens, 0 for padding: `[B, G, T]`.
    mask: Tensor<3>,
    /// Tokens of each response (`[B·G]`), for trimming the logged per-token rows.
    lengths: Vec<usize>,
    /// Host copies for the fused step: prompts, responses, advantages, log π_old, log π_ref.
    host: Option<HostRollout>,
    stats: RolloutStats,
    groups: Option<Vec<GroupRecord>>,
}

/// Per-token log π and log π_old of the logged groups (last step of an iteration).
type TokenDetail = Option<(Vec<Vec<f32>>, Vec<Vec<f32>>)>;

struct HostRollout {
    prompts: Vec<u32>,
    responses: Vec<u32>,
    advantages: Vec<f32>,
    old_logp: Vec<f32>,
    ref_logp: Vec<f32>,
}

#[derive(Debug, Clone, Copy, Default)]
struct RolloutStats {
    reward_mean: f32,
    reward_std: f32,
    reward_min: f32,
    reward_max: f32,
    frac_zero_std: f32,
    exact_match: f32,
    advantage_mean_abs: f32,
    mean_length: f32,
    min_length: f32,
    max_length: f32,
    mean_length_correct: f32,
    mean_length_wrong: f32,
    clipped_ratio: f32,
    resampled_groups: usize,
    resample_rounds: usize,
    zero_std_first_draw: f32,
    accuracy_train: f32,
    accuracy_heldout: Option<f32>,
    tokens: usize,
}

/// Wall time spent in each part of the loop since the last reset (for `grpo-lab bench`).
/// On a wgpu device work is asynchronous: a part's time includes waiting for earlier work
/// at its first read-back.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Rollout: the policy's forward for sampling, sampling, verifying (and, when fused in
    /// the kernels, advantages), dynamic-sampling rounds included.
    pub rollout: f64,
    /// Advantages computed after the rollout (when not fused into it).
    pub advantages: f64,
    /// `log π_old` and `log π_ref` of the sampled tokens.
    pub old_ref_logp: f64,
    /// Greedy accuracy on the batch and the held-out prompts (metrics).
    pub evaluation: f64,
    /// Forward, loss, backward and the step's scalar read-back (on the fused path, the whole
    /// step: its Adam update is part of the same pass).
    pub forward_backward: f64,
    /// Gradient clipping and the Adam update.
    pub optimizer: f64,
}

/// A GRPO run in progress.
pub struct Trainer {
    pub config: RunConfig,
    pub compute: Compute,
    pub prompts: PromptSet,
    pub reward_fn: RewardFn,
    device: Device,
    policy: Policy,
    reference: Policy,
    optim: ModuleOptimizer,
    /// The iteration in progress (or next to start).
    iteration: usize,
    step_in_iteration: usize,
    global_step: usize,
    rollout: Option<Rollout>,
    last_reward_mean: f32,
    /// Our WGSL kernels for sampling, verifying and advantages (None: the Rust reference path).
    kernels: Option<Arc<Kernels>>,
    /// Per training prompt: exact-match rate of its last group (prioritized sampling).
    success: Vec<f32>,
    /// Training prompt indices from easy to hard (curriculum).
    by_difficulty: Vec<usize>,
    /// The supervised cold start has run (or there is none).
    sft_done: bool,
    sft_heldout_accuracy: Option<f32>,
    timings: Timings,
    /// The lecture model's fused CPU step, when the config and device allow it.
    fused: Option<FusedLecture>,
    /// The reference's weights for the fused path's log π_ref (rebuilt when the reference is).
    fused_reference: Option<FusedLecture>,
}

/// Sampled and scored responses of some prompts, `G` per prompt, on either path.
struct Scored {
    /// Each response's tokens (`n` for the lecture model; up to `max_len`, `<eos>` included,
    /// for the transformer).
    rows: Vec<Vec<u32>>,
    /// Closed with `<eos>` (always true for the lecture model, which has a fixed length).
    closed: Vec<bool>,
    /// `[B, G]`
    rewards: Vec<f32>,
    /// `[B, G]`: 1 where the response is exactly sorted (and closed).
    exact: Vec<u32>,
    /// `AdvantageMode::ALL` order, each `[B, G]`; None until computed.
    advantages: Option<Vec<Vec<f32>>>,
    zero_std: Option<Vec<bool>>,
    /// The lecture model's logits `[B, n, V]` (greedy accuracy comes free from them).
    lecture_logits: Vec<f32>,
}

/// `b` of the training prompts, without replacement, each with weight `1 − success + 0.05`
/// (Kimi k1.5's prioritized sampling; the floor keeps solved prompts coming back now and then),
/// by Efraimidis–Spirakis keys `ln(u)/w`.
pub fn prioritized_indices(success: &[f32], b: usize, rng: &mut SplitMix64) -> Vec<usize> {
    let mut keyed: Vec<(f64, usize)> = success
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let w = (1.0 - s as f64).max(0.0) + 0.05;
            (rng.next_f64().max(1e-300).ln() / w, i)
        })
        .collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().take(b).map(|(_, i)| i).collect()
}

/// Number of inversions of a prompt: 0 for a sorted one (the curriculum's difficulty).
fn inversions(p: &[u32]) -> usize {
    (0..p.len())
        .flat_map(|i| (i + 1..p.len()).map(move |j| (i, j)))
        .filter(|&(i, j)| p[i] > p[j])
        .count()
}

impl Trainer {
    pub fn new(config: RunConfig, compute: Compute) -> Result<Self, TrainError> {
        let prompts = PromptSet::build(&config.task, config.run.seed)?;
        let device = compute.device.clone().autodiff();
        let policy = Policy::new(&config, &device);
        let reference = policy.snapshot(&device);
        let kernels = match (config.run.kernels, &compute.gpu) {
            (KernelChoice::Reference, _) | (KernelChoice::Auto, None) => None,
            (KernelChoice::Gpu, None) => {
                return Err(TrainError::KernelsNeedWgpu(compute.label.clone()));
            }
            (_, Some(ctx)) => Some(Arc::new(Kernels::new(ctx.clone())?)),
        };
        let optim = Self::adam(&config.optimizer);
        let fused = (config.run.fused_step == FusedChoice::Auto
            && compute.gpu.is_none()
            && FusedLecture::supports(&config))
        .then(|| match &policy {
            Policy::Lecture(m) => Some(FusedLecture::new(
                &m.weights(),
                config.task.vocab,
                config.task.n,
                config.model.d_model,
                &config,
            )),
            Policy::Transformer(_) => None,
        })
        .flatten();
        let mut by_difficulty: Vec<usize> = (0..prompts.train.len()).collect();
        by_difficulty.sort_by_key(|&i| (inversions(&prompts.train[i]), i));
        Ok(Self {
            reward_fn: RewardFn::from_task(&config.task),
            success: vec![0.0; prompts.train.len()],
            by_difficulty,
            sft_done: config.sft.steps == 0,
            sft_heldout_accuracy: None,
            timings: Timings::default(),
            fused_reference: fused.clone(),
            fused,
            config,
            compute,
            prompts,
            device,
            policy,
            reference,
            optim,
            iteration: 0,
            step_in_iteration: 0,
            global_step: 0,
            rollout: None,
            last_reward_mean: f32::NAN,
            kernels,
        })
    }

    fn adam(o: &crate::config::OptimizerConfig) -> ModuleOptimizer {
        AdamConfig::new()
            .with_beta_1(o.beta1 as f32)
            .with_beta_2(o.beta2 as f32)
            .with_epsilon(o.eps as f32)
            .init()
    }

    pub fn iteration(&self) -> usize {
        self.iteration
    }
    pub fn global_step(&self) -> usize {
        self.global_step
    }
    pub fn is_done(&self) -> bool {
        self.iteration >= self.config.run.iterations
    }
    /// True between iterations: the only points where checkpoints are taken.
    pub fn at_iteration_boundary(&self) -> bool {
        self.step_in_iteration == 0 && self.rollout.is_none()
    }
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
    /// Mean reward of the most recent rollouts.
    pub fn last_reward_mean(&self) -> f32 {
        self.last_reward_mean
    }
    /// Seconds spent in each part of the loop since `reset_timings`.
    pub fn timings(&self) -> Timings {
        self.timings
    }
    pub fn reset_timings(&mut self) {
        self.timings = Timings::default();
    }
    /// Held-out greedy accuracy right after the supervised cold start, if there was one.
    pub fn sft_heldout_accuracy(&self) -> Option<f32> {
        self.sft_heldout_accuracy
    }
    /// `<eos>` of the transformer's vocabulary (one past the numbers).
    fn eos(&self) -> u32 {
        self.config.task.vocab as u32
    }

    fn loss_settings(&self) -> LossSettings {
        let a = &self.config.algorithm;
        LossSettings {
            mode: a.loss,
            epsilon_low: a.epsilon_low as f32,
            epsilon_high: a.epsilon_high as f32,
            beta: a.beta as f32,
            kl_in_loss: a.kl_penalty == KlPenaltyMode::Loss,
            kl_estimator: a.kl_estimator,
            agg: a.loss_agg_mode,
            bug_ratio_quotient: a.bugs.ratio_as_logprob_quotient,
        }
    }

    fn sampling_params(&self) -> SamplingParams {
        let s = &self.config.sampling;
        SamplingParams {
            temperature: s.temperature as f32,
            top_k: s.top_k,
            top_p: s.top_p as f32,
        }
    }

    /// The policy on the inner backend, without autodiff: for rollouts and evaluation, which
    /// never backpropagate (a forward pass on tracked parameters would keep its graph alive).
    fn frozen(&self) -> Policy {
        self.policy.valid()
    }

    fn prompt_tensor(&self, prompts: &[&Vec<u32>]) -> Tensor<2, Int> {
        let n = self.config.task.n;
        let flat: Vec<i64> = prompts
            .iter()
            .flat_map(|p| p.iter().map(|&x| x as i64))
            .collect();
        Tensor::from_data(TensorData::new(flat, [prompts.len(), n]), &self.device)
    }

    /// `[X, G, T]` token ids, rows padded with `<eos>` to `T`, and the matching mask.
    fn response_tensors(&self, rows: &[Vec<u32>], g: usize) -> (Tensor<3, Int>, Tensor<3>, usize) {
        let t = rows.iter().map(|r| r.len()).max().unwrap_or(1).max(1);
        let x = rows.len() / g;
        let pad = self.eos() as i64;
        let mut ids = Vec::with_capacity(rows.len() * t);
        let mut mask = Vec::with_capacity(rows.len() * t);
        for r in rows {
            for i in 0..t {
                ids.push(r.get(i).map(|&v| v as i64).unwrap_or(pad));
                mask.push(if i < r.len() { 1.0f32 } else { 0.0 });
            }
        }
        (
            Tensor::from_data(TensorData::new(ids, [x, g, t]), &self.device),
            Tensor::from_data(TensorData::new(mask, [x, g, t]), &self.device),
            t,
        )
    }

    /// Which training prompts this iteration uses, as a function of (seed, iteration) and,
    /// for prioritized sampling, of the success rates so far (kept in checkpoints).
    fn batch_indices(&self, iteration: usize) -> Vec<usize> {
        let train = self.prompts.train.len();
        let b = self.config.batch_prompts(train);
        let mut idx: Vec<usize> = (0..train).collect();
        if b >= train {
            return idx;
        }
        let mut rng = SplitMix64::for_stream(
            self.config.run.seed ^ (iteration as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            "batch",
        );
        match self.config.algorithm.prompt_sampling {
            PromptSampling::Uniform => {
                rng.shuffle(&mut idx);
                idx.truncate(b);
                idx
            }
            PromptSampling::Prioritized => prioritized_indices(&self.success, b, &mut rng),
            PromptSampling::Curriculum => {
                // The easiest quarter first, growing linearly to every prompt at mid-run.
                let half = (self.config.run.iterations / 2).max(1) as f64;
                let frac = (0.25 + 0.75 * iteration as f64 / half).min(1.0);
                let pool = ((train as f64 * frac).ceil() as usize).clamp(b, train);
                let mut pool: Vec<usize> = self.by_difficulty[..pool].to_vec();
                rng.shuffle(&mut pool);
                pool.truncate(b);
                pool
            }
        }
    }

    /// Greedy exact-match accuracy of the current policy on a prompt list.
    pub fn greedy_accuracy(&self, prompts: &[Vec<u32>]) -> Option<f32> {
        if prompts.is_empty() {
            return None;
        }
        let refs: Vec<&Vec<u32>> = prompts.iter().collect();
        let n = self.config.task.n;
        let mut correct = 0;
        let frozen = self.frozen();
        let inner = &self.compute.device;
        // Chunks keep the device buffers small for large held-out sets.
        for chunk in refs.chunks(1024) {
            match &frozen {
                Policy::Lecture(m) => {
                    let greedy: Vec<u32> = match &self.fused {
                        Some(f) => sampling::argmax_rows(
                            &f.logits(
                                &chunk
                                    .iter()
                                    .flat_map(|p| p.iter().copied())
                                    .collect::<Vec<_>>(),
                            ),
                            self.config.task.vocab,
                        ),
                        None => m
                            .forward(self.prompt_tensor(chunk).without_autodiff())
                            .argmax(2)
                            .into_data()
                            .iter::<i64>()
                            .map(|x| x as u32)
                            .collect(),
                    };
                    for (p, resp) in chunk.iter().zip(greedy.chunks(n)) {
                        correct += crate::task::reward::exact(p, resp);
                    }
                }
                Policy::Transformer(_) => {
                    let v = self.config.task.vocab + 1;
                    let generated = frozen
                        .generate(chunk, 1, self.config.max_len(), inner, |l, _| {
                            Ok::<_, TrainError>(sampling::argmax_rows(l, v))
                        })
                        .expect("argmax cannot fail");
                    for (p, row) in chunk.iter().zip(&generated.rows) {
                        correct += ArResponse::parse(row, self.eos()).exact(p) as u32;
                    }
                }
            }
        }
        Some(correct as f32 / prompts.len() as f32)
    }

    /// `(train, held-out)` greedy accuracy.
    pub fn evaluate(&self) -> (f32, Option<f32>) {
        (
            self.greedy_accuracy(&self.prompts.train).unwrap_or(0.0),
            self.greedy_accuracy(&self.prompts.heldout),
        )
    }

    /// Sample `G` responses per prompt and score them (and, if asked, compute their
    /// advantages), in our kernels or on the Rust reference path. `stream` keys the
    /// random numbers: the iteration for the first draw, a hash of it for resampling.
    fn sample_and_score(
        &self,
        batch: &[&Vec<u32>],
        stream: u32,
        with_advantages: bool,
    ) -> Result<Scored, TrainError> {
        let cfg = &self.config;
        let (g, b) = (cfg.algorithm.num_generations, batch.len());
        let seed = cfg.run.seed;
        let frozen = self.frozen();
        let mut scored = match &frozen {
            Policy::Lecture(m) => {
                let logits: Vec<f32> = match &self.fused {
                    Some(f) => f.logits(
                        &batch
                            .iter()
                            .flat_map(|p| p.iter().copied())
                            .collect::<Vec<_>>(),
                    ),
                    None => m
                        .forward(self.prompt_tensor(batch).without_autodiff()) // [B, n, V]
                        .to_data()
                        .try_to_vec::<f32>()
                        .expect("f32 logits"),
                };
                self.sample_lecture(logits, batch, stream, with_advantages)?
            }
            Policy::Transformer(_) => {
                let params = self.sampling_params();
                let v = cfg.task.vocab + 1;
                let rows_n = b * g;
                let kernels = self.kernels.clone();
                let generated = frozen.generate(
                    batch,
                    g,
                    cfg.max_len(),
                    &self.compute.device,
                    |logits, t| -> Result<Vec<u32>, TrainError> {
                        // One draw per row: (row, 0, 0) coordinates under a per-position stream,
                        // so the kernel and the Rust path pick the same tokens.
                        let step_stream = counter_u32(seed, &[stream, t as u32, 0xA7]);
                        Ok(match &kernels {
                            Some(k) => {
                                k.sample(logits, rows_n, 1, v, 1, params, seed, step_stream)?
                            }
                            None => sampling::sample_independent(
                                logits,
                                rows_n,
                                1,
                                v,
                                1,
                                params,
                                seed,
                                step_stream,
                            ),
                        })
                    },
                )?;
                let eos = self.eos();
                let t = &cfg.task;
                let max_len = cfg.max_len();
                let parsed: Vec<ArResponse> = generated
                    .rows
                    .iter()
                    .map(|r| ArResponse::parse(r, eos))
                    .collect();
                let exact: Vec<u32> = parsed
                    .iter()
                    .enumerate()
                    .map(|(i, r)| r.exact(batch[i / g]) as u32)
                    .collect();
                let mut rewards: Vec<f32> = parsed
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let mut x = self.reward_fn.reward_ar(batch[i / g], r);
                        if r.closed {
                            x += t.format_reward as f32;
                        }
                        if t.length_reward == LengthReward::Overlong {
                            x += t.length_reward_weight as f32
                                * overlong_penalty(r.length, max_len, t.overlong_buffer, !r.closed);
                        }
                        x
                    })
                    .collect();
                if t.length_reward == LengthReward::Kimi {
                    for gi in 0..b {
                        let span = gi * g..(gi + 1) * g;
                        let lens: Vec<usize> =
                            parsed[span.clone()].iter().map(|r| r.length).collect();
                        let ok: Vec<bool> = exact[span.clone()].iter().map(|&e| e == 1).collect();
                        for (x, l) in rewards[span]
                            .iter_mut()
                            .zip(kimi_length_rewards(&lens, &ok))
                        {
                            *x += t.length_reward_weight as f32 * l;
                        }
                    }
                }
                Scored {
                    closed: generated.closed,
                    rows: generated.rows,
                    rewards,
                    exact,
                    advantages: None,
                    zero_std: None,
                    lecture_logits: Vec::new(),
                }
            }
        };
        if with_advantages && scored.advantages.is_none() {
            let rewards = scored.rewards.clone();
            self.fill_advantages(&mut scored, &rewards, g)?;
        }
        Ok(scored)
    }

    /// The lecture model's rollout: all positions sampled at once from `logits [B, n, V]`.
    fn sample_lecture(
        &self,
        logits: Vec<f32>,
        batch: &[&Vec<u32>],
        stream: u32,
        with_advantages: bool,
    ) -> Result<Scored, TrainError> {
        let cfg = &self.config;
        let (n, vocab, g, b) = (
            cfg.task.n,
            cfg.task.vocab,
            cfg.algorithm.num_generations,
            batch.len(),
        );
        let seed = cfg.run.seed;
        if let Some(k) = &self.kernels {
            let prompts: Vec<u32> = batch.iter().flat_map(|p| p.iter().copied()).collect();
            let (tokens, score, adv) = k.rollout(
                &logits,
                &prompts,
                (b, n, vocab, g, n),
                self.sampling_params(),
                seed,
                stream,
                self.reward_fn.kernel_weights(),
                with_advantages,
            )?;
            return Ok(Scored {
                rows: tokens.chunks(n).map(|c| c.to_vec()).collect(),
                closed: vec![true; b * g],
                exact: score.parts.iter().map(|p| p[3]).collect(),
                rewards: score.rewards,
                zero_std: adv
                    .as_ref()
                    .map(|a| a.groups.iter().map(|s| s.zero_std).collect()),
                advantages: adv.map(|a| a.by_mode),
                lecture_logits: logits,
            });
        }
        let tokens = sampling::sample_independent(
            &logits,
            b,
            n,
            vocab,
            g,
            self.sampling_params(),
            seed,
            stream,
        );
        let rows: Vec<Vec<u32>> = tokens.chunks(n).map(|c| c.to_vec()).collect();
        let rewards = rows
            .iter()
            .enumerate()
            .map(|(i, r)| self.reward_fn.reward(batch[i / g], r))
            .collect();
        // Each prompt sorted once for its G responses.
        let sorted: Vec<Vec<u32>> = batch.iter().map(|p| crate::task::sort::sorted(p)).collect();
        let exact = rows
            .iter()
            .enumerate()
            .map(|(i, r)| (sorted[i / g] == *r) as u32)
            .collect();
        Ok(Scored {
            closed: vec![true; b * g],
            rows,
            rewards,
            exact,
            advantages: None,
            zero_std: None,
            lecture_logits: logits,
        })
    }

    fn fill_advantages(
        &self,
        scored: &mut Scored,
        rewards: &[f32],
        g: usize,
    ) -> Result<(), TrainError> {
        if let Some(k) = &self.kernels {
            let out = k.advantages(rewards, g)?;
            scored.zero_std = Some(out.groups.iter().map(|s| s.zero_std).collect());
            scored.advantages = Some(out.by_mode);
        } else {
            let all = advantage::all_advantages(rewards, g);
            scored.zero_std = Some(all.groups.iter().map(|s| s.zero_std).collect());
            scored.advantages = Some(
                AdvantageMode::ALL
                    .iter()
                    .map(|m| all.by_mode[m.name()].clone())
                    .collect(),
            );
        }
        Ok(())
    }

    /// The supervised cold start (DeepSeek-R1's recipe): `sft.steps` Adam steps of
    /// cross-entropy on (prompt, sorted) pairs from the training prompts, `<eos>` included for
    /// the transformer. The reference then starts from the fine-tuned policy, as in R1.
    pub fn cold_start(&mut self) -> Result<(), TrainError> {
        if self.sft_done {
            return Ok(());
        }
        let s = self.config.sft.clone();
        let mut order: Vec<usize> = (0..self.prompts.train.len()).collect();
        SplitMix64::for_stream(self.config.run.seed, "sft").shuffle(&mut order);
        order.truncate(s.examples.max(1));
        let mut optim = Self::adam(&self.config.optimizer);
        let eos = self.eos();
        let ar = self.policy.is_autoregressive();
        let mut last_loss = 0.0f32;
        for step in 0..s.steps {
            let batch: Vec<&Vec<u32>> = (0..s.batch_size)
                .map(|j| &self.prompts.train[order[(step * s.batch_size + j) % order.len()]])
                .collect();
            let targets: Vec<Vec<u32>> = batch
                .iter()
                .map(|p| {
                    let mut t = crate::task::sort::sorted(p);
                    if ar {
                        t.push(eos);
                    }
                    t
                })
                .collect();
            let (responses, _, _) = self.response_tensors(&targets, 1);
            let (logp, _) = self
                .policy
                .score(self.prompt_tensor(&batch), responses, 1.0);
            let loss = logp.mean().neg();
            if step + 1 == s.steps {
                last_loss = loss.clone().into_data().try_to_vec::<f32>().expect("f32")[0];
            }
            let grads = GradientsParams::from_grads(loss.backward(), &self.policy);
            self.policy = optim.step(s.lr, self.policy.clone(), grads);
        }
        if !last_loss.is_finite() {
            return Err(TrainError::NonFinite {
                step: 0,
                iteration: 0,
                value: last_loss,
            });
        }
        self.refresh_reference();
        self.sft_heldout_accuracy = self.greedy_accuracy(&self.prompts.heldout);
        self.sft_done = true;
        log::info!(
            "cold start: {} supervised steps, final loss {last_loss:.4}, held-out accuracy {:?}",
            s.steps,
            self.sft_heldout_accuracy
        );
        Ok(())
    }

    /// Steps 1–5 of GRPO-SPEC §2 for the current iteration.
    fn roll_out(&mut self) -> Result<Rollout, TrainError> {
        self.cold_start()?;
        let cfg = self.config.clone();
        let a = &cfg.algorithm;
        let g = a.num_generations;
        let iteration = self.iteration;
        // 1. Reference ← a real copy of the policy, every `ref_period` iterations.
        if iteration > 0 && a.ref_period > 0 && iteration.is_multiple_of(a.ref_period) {
            self.refresh_reference();
        }
        // 2. Sample G responses per prompt from π_old; 3. score them.
        let mut clock = Instant::now();
        let mut lap = |slot: &mut f64| {
            *slot += clock.elapsed().as_secs_f64();
            clock = Instant::now();
        };
        let mut indices = self.batch_indices(iteration);
        let kl_in_reward = a.kl_penalty == KlPenaltyMode::Reward && a.beta > 0.0;
        let fused_advantages = !kl_in_reward && !a.dynamic_sampling;
        let mut scored = {
            let batch: Vec<&Vec<u32>> = indices.iter().map(|&i| &self.prompts.train[i]).collect();
            self.sample_and_score(&batch, iteration as u32, fused_advantages)?
        };
        let flat_groups = |rewards: &[f32]| -> Vec<usize> {
            (0..rewards.len() / g)
                .filter(|&i| GroupStats::of(&rewards[i * g..(i + 1) * g]).zero_std)
                .collect()
        };
        let first_flat = flat_groups(&scored.rewards);
        let zero_std_first_draw = first_flat.len() as f32 / indices.len() as f32;
        // Dynamic sampling (DAPO): replace groups with no learning signal by fresh ones —
        // unused prompts first, else new responses to the same prompt — at most
        // `max_resample_rounds` times; groups still flat after that stay (their advantage is 0).
        let (mut resampled_groups, mut resample_rounds) = (0, 0);
        if a.dynamic_sampling {
            let mut flat = first_flat;
            let mut spare: Vec<usize> = (0..self.prompts.train.len())
                .filter(|i| !indices.contains(i))
                .collect();
            SplitMix64::for_stream(cfg.run.seed ^ iteration as u64, "resample").shuffle(&mut spare);
            while !flat.is_empty() && resample_rounds < a.max_resample_rounds {
                resample_rounds += 1;
                let fresh: Vec<usize> = flat
                    .iter()
                    .map(|&gi| spare.pop().unwrap_or(indices[gi]))
                    .collect();
                let batch: Vec<&Vec<u32>> = fresh.iter().map(|&i| &self.prompts.train[i]).collect();
                let stream = counter_u32(
                    cfg.run.seed,
                    &[iteration as u32, resample_rounds as u32, 0xD5],
                );
                let more = self.sample_and_score(&batch, stream, false)?;
                for (k, &gi) in flat.iter().enumerate() {
                    indices[gi] = fresh[k];
                    for j in 0..g {
                        let (dst, src) = (gi * g + j, k * g + j);
                        scored.rows[dst] = more.rows[src].clone();
                        scored.closed[dst] = more.closed[src];
                        scored.rewards[dst] = more.rewards[src];
                        scored.exact[dst] = more.exact[src];
                    }
                }
                resampled_groups += flat.len();
                flat = flat_groups(&scored.rewards);
            }
            scored.advantages = None;
        }
        lap(&mut self.timings.rollout);
        let batch: Vec<&Vec<u32>> = indices.iter().map(|&i| &self.prompts.train[i]).collect();
        let b = batch.len();
        let prompts = self.prompt_tensor(&batch);
        let (responses, mask, _t) = self.response_tensors(&scored.rows, g);
        // 5. log π_old and log π_ref of every sampled token, frozen.
        let temperature = cfg.sampling.temperature as f32;
        // On the fused path log π_old and log π_ref come from the same arithmetic as the step.
        let fused_logp = self.fused.as_ref().map(|f| {
            let prompts: Vec<u32> = batch.iter().flat_map(|p| p.iter().copied()).collect();
            let responses: Vec<u32> = scored.rows.iter().flatten().copied().collect();
            // The rollout sampled from these very logits (same weights, same forward):
            // log π_old reuses them unless dynamic sampling replaced some prompts.
            let old_logp = if a.dynamic_sampling || scored.lecture_logits.is_empty() {
                f.token_logp(&prompts, &responses, temperature)
            } else {
                f.token_logp_from_logits(&scored.lecture_logits, &responses, temperature)
            };
            let ref_logp = self
                .fused_reference
                .as_ref()
                .expect("set with the fused path")
                .token_logp(&prompts, &responses, temperature);
            HostRollout {
                prompts,
                responses,
                advantages: Vec::new(), // filled once the advantages are known
                old_logp,
                ref_logp,
            }
        });
        let frozen_logp = |p: &Policy| {
            p.valid()
                .score(
                    prompts.clone().without_autodiff(),
                    responses.clone().without_autodiff(),
                    temperature,
                )
                .0
                .autodiff()
        };
        let to_tensor = |v: &Vec<f32>| {
            Tensor::<3>::from_data(TensorData::new(v.clone(), [b, g, _t]), &self.device)
        };
        let old_logp = match &fused_logp {
            Some(h) => to_tensor(&h.old_logp),
            None => frozen_logp(&self.policy),
        };
        let ref_logp = if a.bugs.shared_reference {
            // BUG (gallery): the "reference" is the policy itself, so it moves every iteration.
            old_logp.clone()
        } else {
            match &fused_logp {
                Some(h) => to_tensor(&h.ref_logp),
                None => frozen_logp(&self.reference),
            }
        };
        let _ = old_logp.clone().slice([0..1, 0..1, 0..1]).into_data(); // wait for it
        lap(&mut self.timings.old_ref_logp);
        // 4. Advantages from the scores (minus the KL when it goes into the reward), every
        // mode for the same rewards; one drives the update.
        let scores = scored.rewards.clone();
        if kl_in_reward {
            // PPO-RLHF style: r − β·Σ_t KL_t(π_old ‖ π_ref), per response, over real tokens.
            let kl = loss::kl_tokens(a.kl_estimator, old_logp.clone(), ref_logp.clone())
                .mul(mask.clone())
                .sum_dim(2)
                .into_data()
                .try_to_vec::<f32>()
                .expect("f32");
            let penalized: Vec<f32> = scores
                .iter()
                .zip(kl)
                .map(|(r, k)| r - a.beta as f32 * k)
                .collect();
            self.fill_advantages(&mut scored, &penalized, g)?;
        } else if scored.advantages.is_none() {
            self.fill_advantages(&mut scored, &scores, g)?;
        }
        let by_mode = scored.advantages.take().expect("advantages computed");
        let zero_std = scored.zero_std.take().expect("advantages computed");
        let mode_index = AdvantageMode::ALL
            .iter()
            .position(|m| *m == a.advantage)
            .expect("known mode");
        let driving = &by_mode[mode_index];
        let advantages =
            Tensor::<2>::from_data(TensorData::new(driving.clone(), [b, g]), &self.device);
        lap(&mut self.timings.advantages);

        // Prioritized sampling remembers each prompt's success rate.
        for (k, &pi) in indices.iter().enumerate() {
            let hits: u32 = scored.exact[k * g..(k + 1) * g].iter().sum();
            self.success[pi] = hits as f32 / g as f32;
        }
        let batch_stats = GroupStats::of(&scores);
        let exact_match = scored.exact.iter().sum::<u32>() as f32 / scored.exact.len() as f32;
        let lengths: Vec<usize> = scored.rows.iter().map(|r| r.len()).collect();
        let mean_of = |sel: &dyn Fn(usize) -> bool| -> f32 {
            let v: Vec<f32> = (0..lengths.len())
                .filter(|&i| sel(i))
                .map(|i| lengths[i] as f32)
                .collect();
            if v.is_empty() {
                f32::NAN
            } else {
                v.iter().sum::<f32>() / v.len() as f32
            }
        };
        // Greedy accuracy on this iteration's training prompts (from the rollout's own logits
        // for the lecture model); the held-out split is scored in full.
        let accuracy_train = if scored.lecture_logits.is_empty() || a.dynamic_sampling {
            self.greedy_accuracy(&batch.iter().map(|p| (*p).clone()).collect::<Vec<_>>())
                .unwrap_or(0.0)
        } else {
            let (n, vocab) = (cfg.task.n, cfg.task.vocab);
            let greedy = sampling::argmax_rows(&scored.lecture_logits, vocab);
            batch
                .iter()
                .zip(greedy.chunks(n))
                .filter(|(p, r)| crate::task::reward::exact(p, r) == 1)
                .count() as f32
                / b as f32
        };
        let accuracy_heldout = self.greedy_accuracy(&self.prompts.heldout);
        lap(&mut self.timings.evaluation);
        let stats = RolloutStats {
            reward_mean: batch_stats.mean,
            reward_std: batch_stats.std,
            reward_min: batch_stats.min,
            reward_max: batch_stats.max,
            frac_zero_std: zero_std.iter().filter(|z| **z).count() as f32 / zero_std.len() as f32,
            exact_match,
            advantage_mean_abs: driving.iter().map(|x| x.abs()).sum::<f32>() / driving.len() as f32,
            mean_length: mean_of(&|_| true),
            min_length: lengths.iter().copied().min().unwrap_or(0) as f32,
            max_length: lengths.iter().copied().max().unwrap_or(0) as f32,
            mean_length_correct: mean_of(&|i| scored.exact[i] == 1),
            mean_length_wrong: mean_of(&|i| scored.exact[i] == 0),
            clipped_ratio: scored.closed.iter().filter(|c| !**c).count() as f32
                / scored.closed.len() as f32,
            resampled_groups,
            resample_rounds,
            zero_std_first_draw,
            accuracy_train,
            accuracy_heldout,
            tokens: lengths.iter().sum(),
        };
        // Logged responses show `<eos>` as the tokenizer's id, so they decode as `<eos>`.
        let eos = self.eos();
        let shown = |r: &Vec<u32>| -> Vec<u32> {
            r.iter()
                .map(|&x| {
                    if x == eos && self.policy.is_autoregressive() {
                        EOS_ID
                    } else {
                        x
                    }
                })
                .collect()
        };
        let groups = (cfg.run.log_groups > 0).then(|| {
            (0..b.min(cfg.run.log_groups))
                .map(|bi| GroupRecord {
                    prompt_index: indices[bi],
                    prompt: batch[bi].clone(),
                    responses: scored.rows[bi * g..(bi + 1) * g]
                        .iter()
                        .map(shown)
                        .collect(),
                    rewards: scores[bi * g..(bi + 1) * g].to_vec(),
                    advantages: AdvantageMode::ALL
                        .iter()
                        .zip(&by_mode)
                        .map(|(m, v)| (m.name().to_string(), v[bi * g..(bi + 1) * g].to_vec()))
                        .collect(),
                    zero_std: zero_std[bi],
                    old_logp: Vec::new(),
                    logp: Vec::new(),
                })
                .collect()
        });
        self.last_reward_mean = stats.reward_mean;
        let host = fused_logp.map(|h| HostRollout {
            advantages: driving.clone(),
            ..h
        });
        Ok(Rollout {
            prompts,
            responses,
            advantages,
            old_logp,
            ref_logp,
            mask,
            lengths,
            host,
            stats,
            groups,
        })
    }

    /// One optimizer step (step 6 of GRPO-SPEC §2), rolling out first when an iteration begins.
    pub fn step(&mut self) -> Result<StepRecord, TrainError> {
        let started = Instant::now();
        if self.rollout.is_none() {
            let rollout = self.roll_out()?;
            self.rollout = Some(rollout);
        }
        // A config changed live (the app's Apply) to something the fused path does not cover
        // (a bug switch, the entropy bonus) moves the run to burn's path for good.
        if self.fused.is_some() && !FusedLecture::supports(&self.config) {
            self.sync_fused_weights();
            self.fused = None;
            self.fused_reference = None;
        }
        let last_of_iteration = self.step_in_iteration + 1 >= self.config.algorithm.mu;
        let fused = self.fused.is_some() && self.rollout.as_ref().is_some_and(|r| r.host.is_some());
        let (sc, token_detail) = if fused {
            self.fused_step(last_of_iteration)?
        } else {
            self.burn_step(last_of_iteration)?
        };
        let step = self.global_step + 1;
        let lr = self.config.optimizer.lr;
        let rollout = self.rollout.as_ref().expect("rollout exists");
        let stats = rollout.stats;
        let groups = token_detail.map(|(logp, old_logp)| {
            let mut groups = rollout.groups.clone().unwrap_or_default();
            let g = self.config.algorithm.num_generations;
            for (i, group) in groups.iter_mut().enumerate() {
                group.logp = logp[i * g..(i + 1) * g].to_vec();
                group.old_logp = old_logp[i * g..(i + 1) * g].to_vec();
            }
            groups
        });
        let step_time = started.elapsed().as_secs_f64();
        let record = StepRecord {
            iteration: self.iteration,
            step,
            step_in_iteration: self.step_in_iteration,
            reward_mean: stats.reward_mean,
            reward_std: stats.reward_std,
            reward_min: stats.reward_min,
            reward_max: stats.reward_max,
            frac_reward_zero_std: stats.frac_zero_std,
            exact_match: stats.exact_match,
            advantage_mean_abs: stats.advantage_mean_abs,
            mean_length: stats.mean_length,
            min_length: stats.min_length,
            max_length: stats.max_length,
            mean_length_correct: stats.mean_length_correct,
            mean_length_wrong: stats.mean_length_wrong,
            clipped_ratio: stats.clipped_ratio,
            resampled_groups: stats.resampled_groups,
            resample_rounds: stats.resample_rounds,
            zero_std_first_draw: stats.zero_std_first_draw,
            loss: sc.loss,
            kl: sc.kl,
            entropy: sc.entropy,
            clip_ratio_low: sc.clip_low,
            clip_ratio_high: sc.clip_high,
            ratio_mean: sc.ratio_mean,
            grad_norm: sc.grad_norm,
            lr: lr as f32,
            accuracy_train: stats.accuracy_train,
            accuracy_heldout: stats.accuracy_heldout,
            step_time_secs: step_time as f32,
            tokens_per_second: (stats.tokens as f64 / step_time.max(1e-9)) as f32,
            groups,
        };
        self.global_step = step;
        self.step_in_iteration += 1;
        if self.step_in_iteration >= self.config.algorithm.mu {
            self.step_in_iteration = 0;
            self.iteration += 1;
            self.rollout = None;
            self.sync_fused_weights();
        }
        Ok(record)
    }

    /// A real copy of the policy becomes the reference (and the fused path's copy of it).
    fn refresh_reference(&mut self) {
        self.reference = self.policy.snapshot(&self.device);
        if let (Some(f), Policy::Lecture(m)) = (&mut self.fused, &self.policy) {
            // The cold start trains the burn policy: the fused weights follow it.
            f.set_weights(&m.weights());
            self.fused_reference = Some(f.clone());
        }
    }

    /// The burn policy takes the fused path's weights (between iterations: rollouts,
    /// evaluation and checkpoints read the burn policy).
    fn sync_fused_weights(&mut self) {
        if let Some(f) = &self.fused {
            self.policy = Policy::Lecture(crate::model::LecturePolicy::from_weights(
                &f.weights(),
                f.vocab,
                f.n,
                f.d,
                &self.device,
            ));
        }
    }

    /// The optimizer step through burn's autodiff (any policy, any config).
    fn burn_step(
        &mut self,
        last_of_iteration: bool,
    ) -> Result<(StepScalars, TokenDetail), TrainError> {
        let fb_started = Instant::now();
        let rollout = self.rollout.as_ref().expect("rollout exists");
        let settings = self.loss_settings();
        let temperature = self.config.sampling.temperature as f32;

        let (logp, token_entropy) = self.policy.score(
            rollout.prompts.clone(),
            rollout.responses.clone(),
            temperature,
        ); // [B, G, T], with gradient
        let old_logp = if self.config.algorithm.bugs.unfrozen_old_policy {
            // BUG (gallery): π_old recomputed with gradient, so ρ ≡ 1 and its gradient vanishes.
            logp.clone()
        } else {
            rollout.old_logp.clone()
        };
        // Per-token log π and log π_old of the logged groups, on the iteration's last step.
        let logged = rollout.groups.as_ref().map(|g| g.len()).unwrap_or(0);
        let token_detail = (last_of_iteration && logged > 0).then(|| {
            let [_, g, t] = logp.dims();
            let rows = |x: &Tensor<3>| -> Vec<Vec<f32>> {
                x.clone()
                    .detach()
                    .slice([0..logged, 0..g, 0..t])
                    .into_data()
                    .try_to_vec::<f32>()
                    .expect("f32")
                    .chunks(t)
                    .zip(&rollout.lengths)
                    .map(|(c, &len)| c[..len.min(t)].to_vec())
                    .collect()
            };
            (rows(&logp), rows(&rollout.old_logp))
        });
        let ref_logp = if self.config.algorithm.bugs.shared_reference {
            // BUG (gallery): the reference is the policy module itself, so log π_ref = log π_θ,
            // gradient included: KL ≡ 0 and its gradient ≡ 0; the penalty silently does nothing.
            logp.clone()
        } else {
            rollout.ref_logp.clone()
        };
        let out = loss::grpo_loss(
            &settings,
            logp,
            old_logp,
            ref_logp,
            rollout.advantages.clone(),
            rollout.mask.clone(),
        );
        let entropy_coef = self.config.algorithm.entropy_coef as f32;
        let loss_t = if entropy_coef > 0.0 {
            // Entropy bonus: − c·H, aggregated like the loss.
            let bonus = loss::aggregate(settings.agg, token_entropy.clone(), rollout.mask.clone());
            out.loss.clone().sub(bonus.mul_scalar(entropy_coef))
        } else {
            out.loss.clone()
        };
        let entropy = loss::aggregate(
            crate::config::LossAggMode::TokenMean,
            token_entropy.detach(),
            rollout.mask.clone(),
        );
        let mut grads = GradientsParams::from_grads(loss_t.clone().backward(), &self.policy);
        let grad_sq = self.policy.grad_norm_sq(&grads, &self.device);
        // One read-back for every scalar of the step.
        let scalars: Vec<f32> = Tensor::cat(
            vec![
                loss_t.detach(),
                out.kl,
                out.clip_low,
                out.clip_high,
                out.ratio_mean,
                entropy,
                grad_sq,
            ],
            0,
        )
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 scalars");
        let [
            loss_v,
            kl,
            clip_low,
            clip_high,
            ratio_mean,
            entropy,
            grad_sq,
        ] = scalars[..].try_into().expect("seven scalars");
        let grad_norm = grad_sq.sqrt();
        let step = self.global_step + 1;
        if !loss_v.is_finite() || !grad_norm.is_finite() {
            return Err(TrainError::NonFinite {
                step,
                iteration: self.iteration,
                value: if loss_v.is_finite() {
                    grad_norm
                } else {
                    loss_v
                },
            });
        }
        self.timings.forward_backward += fb_started.elapsed().as_secs_f64();
        let opt_started = Instant::now();
        let max_norm = self.config.optimizer.max_grad_norm as f32;
        if max_norm > 0.0 && grad_norm > max_norm {
            grads = self.policy.scale_grads(grads, max_norm / grad_norm);
        }
        let lr = self.config.optimizer.lr;
        self.policy = self.optim.step(lr, self.policy.clone(), grads);
        self.timings.optimizer += opt_started.elapsed().as_secs_f64();
        Ok((
            StepScalars {
                loss: loss_v,
                kl,
                clip_low,
                clip_high,
                ratio_mean,
                entropy,
                grad_norm,
            },
            token_detail,
        ))
    }

    /// The optimizer step on the fused CPU path (lecture model; see `grpo::fused`).
    fn fused_step(
        &mut self,
        last_of_iteration: bool,
    ) -> Result<(StepScalars, TokenDetail), TrainError> {
        let started = Instant::now();
        let settings = self.loss_settings();
        let temperature = self.config.sampling.temperature as f32;
        let (lr, max_norm) = (
            self.config.optimizer.lr,
            self.config.optimizer.max_grad_norm as f32,
        );
        let (g, n) = (self.config.algorithm.num_generations, self.config.task.n);
        let rollout = self.rollout.as_ref().expect("rollout exists");
        let h = rollout.host.as_ref().expect("host rollout");
        let fused = self.fused.as_mut().expect("fused path");
        let (sc, logp) = fused.step(
            &h.prompts,
            &h.responses,
            &h.advantages,
            &h.old_logp,
            &h.ref_logp,
            &settings,
            temperature,
            lr,
            max_norm,
        );
        let logged = rollout.groups.as_ref().map(|g| g.len()).unwrap_or(0);
        let detail = (last_of_iteration && logged > 0).then(|| {
            let rows = |x: &[f32]| -> Vec<Vec<f32>> {
                x[..logged * g * n].chunks(n).map(|c| c.to_vec()).collect()
            };
            (rows(&logp), rows(&h.old_logp))
        });
        self.timings.forward_backward += started.elapsed().as_secs_f64();
        if !sc.loss.is_finite() || !sc.grad_norm.is_finite() {
            return Err(TrainError::NonFinite {
                step: self.global_step + 1,
                iteration: self.iteration,
                value: if sc.loss.is_finite() {
                    sc.grad_norm
                } else {
                    sc.loss
                },
            });
        }
        Ok((sc, detail))
    }

    /// Write policy, reference and optimizer state (burnpack) and the counters.
    /// Only between iterations: everything else is a function of (config, seed, iteration).
    pub fn save_checkpoint(&self, dir: &Path) -> Result<(), TrainError> {
        let err = |e: String| TrainError::Checkpoint {
            path: dir.display().to_string(),
            reason: e,
        };
        assert!(
            self.at_iteration_boundary(),
            "checkpoints are taken between iterations"
        );
        std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        self.policy
            .clone()
            .save_file(dir.join("policy.bpk"))
            .map_err(|e| err(e.to_string()))?;
        self.reference
            .clone()
            .save_file(dir.join("reference.bpk"))
            .map_err(|e| err(e.to_string()))?;
        self.optim
            .save(dir.join("optimizer.bpk"))
            .map_err(|e| err(e.to_string()))?;
        if let Some(f) = &self.fused {
            std::fs::write(dir.join("fused_adam.bin"), f.adam_bytes())
                .map_err(|e| err(e.to_string()))?;
        }
        let state = serde_json::json!({
            "iteration": self.iteration,
            "global_step": self.global_step,
            "last_reward_mean": self.last_reward_mean,
            "success": self.success,
            "sft_heldout_accuracy": self.sft_heldout_accuracy,
        });
        std::fs::write(dir.join("state.json"), state.to_string())
            .map_err(|e| err(e.to_string()))?;
        Ok(())
    }

    /// Restore what `save_checkpoint` wrote; the run then continues bit-identically.
    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<(), TrainError> {
        let err = |e: String| TrainError::Checkpoint {
            path: dir.display().to_string(),
            reason: e,
        };
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("state.json")).map_err(|e| err(e.to_string()))?,
        )
        .map_err(|e| err(e.to_string()))?;
        self.policy = self
            .policy
            .clone()
            .try_load_file(dir.join("policy.bpk"))
            .map_err(|e| err(e.to_string()))?;
        self.reference = self
            .reference
            .clone()
            .try_load_file(dir.join("reference.bpk"))
            .map_err(|e| err(e.to_string()))?
            .no_grad();
        self.optim = self
            .optim
            .clone()
            .load(dir.join("optimizer.bpk"))
            .map_err(|e| err(e.to_string()))?;
        self.iteration = state["iteration"]
            .as_u64()
            .ok_or_else(|| err("no iteration".into()))? as usize;
        self.global_step = state["global_step"]
            .as_u64()
            .ok_or_else(|| err("no global_step".into()))? as usize;
        self.last_reward_mean = state["last_reward_mean"].as_f64().unwrap_or(f64::NAN) as f32;
        if let Some(success) = state["success"].as_array() {
            self.success = success
                .iter()
                .map(|x| x.as_f64().unwrap_or(0.0) as f32)
                .collect();
        }
        self.sft_heldout_accuracy = state["sft_heldout_accuracy"].as_f64().map(|x| x as f32);
        // A checkpoint is taken after the cold start, which is in its weights.
        self.sft_done = true;
        // The fused path continues from its own Adam state; a checkpoint written by burn's
        // path has none, so such a run continues on burn's path (with burn's state).
        if let (Some(f), Policy::Lecture(m)) = (&mut self.fused, &self.policy) {
            match std::fs::read(dir.join("fused_adam.bin")) {
                Ok(bytes) => {
                    f.set_weights(&m.weights());
                    f.load_adam_bytes(&bytes).map_err(err)?;
                    if let Policy::Lecture(r) = &self.reference {
                        let mut fr = f.clone();
                        fr.set_weights(&r.weights());
                        self.fused_reference = Some(fr);
                    }
                }
                Err(_) => self.fused = None,
            }
        }
        self.step_in_iteration = 0;
        self.rollout = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prioritized_sampling_prefers_unsolved_prompts() {
        // Prompts 0..50 always solved, 50..100 never.
        let success: Vec<f32> = (0..100).map(|i| if i < 50 { 1.0 } else { 0.0 }).collect();
        let mut rng = SplitMix64::new(1);
        let (mut unsolved, mut total) = (0, 0);
        for _ in 0..200 {
            let pick = prioritized_indices(&success, 10, &mut rng);
            let mut sorted = pick.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 10, "without replacement");
            unsolved += pick.iter().filter(|&&i| i >= 50).count();
            total += pick.len();
        }
        // Weights 1.05 vs 0.05: about 95 % of the draws go to unsolved prompts.
        assert!(unsolved as f64 / total as f64 > 0.9, "{unsolved}/{total}");
    }

    #[test]
    fn inversions_count() {
        assert_eq!(inversions(&[0, 1, 2]), 0);
        assert_eq!(inversions(&[2, 1, 0]), 3);
        assert_eq!(inversions(&[1, 0, 1]), 1);
    }
}
