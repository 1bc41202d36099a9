//! One GRPO run, step by step (GRPO-SPEC §2). `Trainer::step` performs one optimizer
//! step; the first step of each iteration also rolls out, scores and freezes `π_old`.
//! Nothing here blocks on anything but the device, so the app can drive it from a
//! thread and a web build from its frame loop; file I/O lives in `train`.

use crate::config::KernelChoice;
use crate::config::{AdvantageMode, KlPenaltyMode, RunConfig};
use crate::gpu::Compute;
use crate::grpo::advantage::{self, GroupStats};
use crate::grpo::kernels::Kernels;
use crate::grpo::loss::{self, LossSettings};
use crate::grpo::sampling::{self, SamplingParams};
use crate::metrics::{GroupRecord, StepRecord};
use crate::model::LecturePolicy;
use crate::rng::SplitMix64;
use crate::task::sort::TaskError;
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
    /// `[B, G, T]`
    responses: Tensor<3, Int>,
    /// `[B, G]`, under the mode that drives the update.
    advantages: Tensor<2>,
    /// `log π_old`, `[B, G, T]`, computed once without gradient.
    old_logp: Tensor<3>,
    /// `log π_ref`, `[B, G, T]`.
    ref_logp: Tensor<3>,
    /// 1 for real tokens, 0 for padding: `[B, G, T]`.
    mask: Tensor<3>,
    stats: RolloutStats,
    groups: Option<Vec<GroupRecord>>,
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
    accuracy_train: f32,
    accuracy_heldout: Option<f32>,
    tokens: usize,
}

/// A GRPO run in progress.
pub struct Trainer {
    pub config: RunConfig,
    pub compute: Compute,
    pub prompts: PromptSet,
    pub reward_fn: RewardFn,
    device: Device,
    policy: LecturePolicy,
    reference: LecturePolicy,
    optim: ModuleOptimizer,
    /// The iteration in progress (or next to start).
    iteration: usize,
    step_in_iteration: usize,
    global_step: usize,
    rollout: Option<Rollout>,
    last_reward_mean: f32,
    /// Our WGSL kernels for sampling, verifying and advantages (None: the Rust reference path).
    kernels: Option<Arc<Kernels>>,
}

/// What the rollout's sampling, verifying and advantage steps produce, on either path.
struct Scored {
    /// `[B, G, n]`
    tokens: Vec<u32>,
    /// `[B, G]`
    rewards: Vec<f32>,
    /// `[B, G]`: 1 where the response is exactly sorted.
    exact: Vec<u32>,
    /// `AdvantageMode::ALL` order, each `[B, G]`; None until computed.
    advantages: Option<Vec<Vec<f32>>>,
    zero_std: Option<Vec<bool>>,
}

impl Trainer {
    pub fn new(config: RunConfig, compute: Compute) -> Result<Self, TrainError> {
        let prompts = PromptSet::build(&config.task, config.run.seed)?;
        let device = compute.device.clone().autodiff();
        let t = &config.task;
        let policy = LecturePolicy::new(
            t.vocab,
            t.n,
            config.model.d_model,
            config.model.init_scale,
            config.run.seed,
            &device,
        );
        let reference = policy.snapshot(&device);
        let kernels = match (config.run.kernels, &compute.gpu) {
            (KernelChoice::Reference, _) | (KernelChoice::Auto, None) => None,
            (KernelChoice::Gpu, None) => {
                return Err(TrainError::KernelsNeedWgpu(compute.label.clone()));
            }
            (_, Some(ctx)) => Some(Arc::new(Kernels::new(ctx.clone())?)),
        };
        let o = &config.optimizer;
        let optim = AdamConfig::new()
            .with_beta_1(o.beta1 as f32)
            .with_beta_2(o.beta2 as f32)
            .with_epsilon(o.eps as f32)
            .init();
        Ok(Self {
            reward_fn: RewardFn::from_task(&config.task),
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
    pub fn policy(&self) -> &LecturePolicy {
        &self.policy
    }
    /// Mean reward of the most recent rollouts.
    pub fn last_reward_mean(&self) -> f32 {
        self.last_reward_mean
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

    fn prompt_tensor(&self, prompts: &[&Vec<u32>]) -> Tensor<2, Int> {
        let n = self.config.task.n;
        let flat: Vec<i64> = prompts
            .iter()
            .flat_map(|p| p.iter().map(|&x| x as i64))
            .collect();
        Tensor::from_data(TensorData::new(flat, [prompts.len(), n]), &self.device)
    }

    /// Which training prompts this iteration uses: all of them, or `B` drawn without
    /// replacement, as a function of (seed, iteration) alone.
    fn batch_indices(&self, iteration: usize) -> Vec<usize> {
        let train = self.prompts.train.len();
        let b = self.config.batch_prompts(train);
        let mut idx: Vec<usize> = (0..train).collect();
        if b < train {
            let mut rng = SplitMix64::for_stream(
                self.config.run.seed ^ (iteration as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                "batch",
            );
            rng.shuffle(&mut idx);
            idx.truncate(b);
        }
        idx
    }

    /// Greedy exact-match accuracy of the current policy on a prompt list.
    pub fn greedy_accuracy(&self, prompts: &[Vec<u32>]) -> Option<f32> {
        if prompts.is_empty() {
            return None;
        }
        let refs: Vec<&Vec<u32>> = prompts.iter().collect();
        let mut correct = 0;
        // Chunks keep the device buffers small for large held-out sets.
        for chunk in refs.chunks(4096) {
            let logits = self.policy.forward(self.prompt_tensor(chunk)).detach();
            let greedy: Vec<i64> = logits.argmax(2).into_data().iter::<i64>().collect();
            let n = self.config.task.n;
            for (p, resp) in chunk.iter().zip(greedy.chunks(n)) {
                let resp: Vec<u32> = resp.iter().map(|&x| x as u32).collect();
                correct += crate::task::reward::exact(p, &resp);
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

    /// Sample `G` responses per prompt and score them (and, unless the KL goes into the
    /// reward, compute their advantages), in our kernels or on the Rust reference path.
    fn sample_and_score(
        &self,
        logits: &[f32],
        batch: &[&Vec<u32>],
        with_advantages: bool,
    ) -> Result<Scored, TrainError> {
        let cfg = &self.config;
        let (n, vocab, g, b) = (
            cfg.task.n,
            cfg.task.vocab,
            cfg.algorithm.num_generations,
            batch.len(),
        );
        let (seed, iteration) = (cfg.run.seed, self.iteration as u32);
        if let Some(k) = &self.kernels {
            let prompts: Vec<u32> = batch.iter().flat_map(|p| p.iter().copied()).collect();
            let (tokens, score, adv) = k.rollout(
                logits,
                &prompts,
                (b, n, vocab, g, n),
                self.sampling_params(),
                seed,
                iteration,
                self.reward_fn.kernel_weights(),
                with_advantages,
            )?;
            return Ok(Scored {
                tokens,
                exact: score.parts.iter().map(|p| p[3]).collect(),
                rewards: score.rewards,
                zero_std: adv
                    .as_ref()
                    .map(|a| a.groups.iter().map(|s| s.zero_std).collect()),
                advantages: adv.map(|a| a.by_mode),
            });
        }
        let tokens = sampling::sample_independent(
            logits,
            b,
            n,
            vocab,
            g,
            self.sampling_params(),
            seed,
            iteration,
        );
        let responses: Vec<&[u32]> = tokens.chunks(n).collect();
        let rewards: Vec<f32> = responses
            .iter()
            .enumerate()
            .map(|(i, r)| self.reward_fn.reward(batch[i / g], r))
            .collect();
        let exact = responses
            .iter()
            .enumerate()
            .map(|(i, r)| crate::task::reward::exact(batch[i / g], r))
            .collect();
        let mut scored = Scored {
            tokens,
            rewards,
            exact,
            advantages: None,
            zero_std: None,
        };
        if with_advantages {
            let rewards = scored.rewards.clone();
            self.fill_advantages(&mut scored, &rewards, g)?;
        }
        Ok(scored)
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

    /// Steps 1–5 of GRPO-SPEC §2 for the current iteration.
    fn roll_out(&mut self) -> Result<Rollout, TrainError> {
        let cfg = &self.config;
        let a = &cfg.algorithm;
        let (n, vocab, g) = (cfg.task.n, cfg.task.vocab, a.num_generations);
        let iteration = self.iteration;
        // 1. Reference ← a real copy of the policy, every `ref_period` iterations.
        if iteration > 0 && a.ref_period > 0 && iteration.is_multiple_of(a.ref_period) {
            self.reference = self.policy.snapshot(&self.device);
        }
        // 2. Sample G responses per prompt from π_old.
        let indices = self.batch_indices(iteration);
        let batch: Vec<&Vec<u32>> = indices.iter().map(|&i| &self.prompts.train[i]).collect();
        let b = batch.len();
        let prompts = self.prompt_tensor(&batch);
        let logits = self.policy.forward(prompts.clone()).detach(); // [B, n, V]
        let logits_host: Vec<f32> = logits.to_data().try_to_vec::<f32>().expect("f32 logits");
        let kl_in_reward = a.kl_penalty == KlPenaltyMode::Reward && a.beta > 0.0;
        let mut scored = self.sample_and_score(&logits_host, &batch, !kl_in_reward)?;
        let tokens = std::mem::take(&mut scored.tokens);
        let responses = Tensor::<3, Int>::from_data(
            TensorData::new(
                tokens.iter().map(|&x| x as i64).collect::<Vec<_>>(),
                [b, g, n],
            ),
            &self.device,
        );
        // 5. log π_old and log π_ref of every sampled token, frozen.
        let temperature = cfg.sampling.temperature as f32;
        let old_logp =
            loss::token_log_probs(logits.clone(), responses.clone(), temperature).detach();
        let ref_logp = if a.bugs.shared_reference {
            // BUG (gallery): the "reference" is the policy itself, so it moves every iteration.
            old_logp.clone()
        } else {
            let ref_logits = self.reference.forward(prompts.clone()).detach();
            loss::token_log_probs(ref_logits, responses.clone(), temperature).detach()
        };
        // 3. Scores came with the samples; 4. advantages from them (minus the KL when it goes
        // into the reward), every mode for the same rewards; one drives the update.
        let responses_host: Vec<Vec<u32>> = tokens.chunks(n).map(|c| c.to_vec()).collect();
        let scores = scored.rewards.clone();
        let exact_match = scored.exact.iter().sum::<u32>() as f32 / scored.exact.len() as f32;
        if kl_in_reward {
            // PPO-RLHF style: r − β·Σ_t KL_t(π_old ‖ π_ref), per response.
            let kl = loss::kl_tokens(a.kl_estimator, old_logp.clone(), ref_logp.clone())
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
        let mask = Tensor::<3>::ones([b, g, n], &self.device);

        let batch_stats = GroupStats::of(&scores);
        // Greedy accuracy on this iteration's training prompts, from the rollout's own logits;
        // the held-out split is scored in full.
        let greedy = sampling::argmax_rows(&logits_host, vocab);
        let accuracy_train = batch
            .iter()
            .zip(greedy.chunks(n))
            .filter(|(p, r)| crate::task::reward::exact(p, r) == 1)
            .count() as f32
            / b as f32;
        let accuracy_heldout = self.greedy_accuracy(&self.prompts.heldout);
        let stats = RolloutStats {
            reward_mean: batch_stats.mean,
            reward_std: batch_stats.std,
            reward_min: batch_stats.min,
            reward_max: batch_stats.max,
            frac_zero_std: zero_std.iter().filter(|z| **z).count() as f32 / zero_std.len() as f32,
            exact_match,
            advantage_mean_abs: driving.iter().map(|x| x.abs()).sum::<f32>() / driving.len() as f32,
            mean_length: n as f32,
            accuracy_train,
            accuracy_heldout,
            tokens: b * g * n,
        };
        let groups = (cfg.run.log_groups > 0).then(|| {
            (0..b.min(cfg.run.log_groups))
                .map(|bi| GroupRecord {
                    prompt_index: indices[bi],
                    prompt: batch[bi].clone(),
                    responses: responses_host[bi * g..(bi + 1) * g].to_vec(),
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
        Ok(Rollout {
            prompts,
            responses,
            advantages,
            old_logp,
            ref_logp,
            mask,
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
        let rollout = self.rollout.as_ref().expect("rollout exists");
        let settings = self.loss_settings();
        let temperature = self.config.sampling.temperature as f32;

        let logits = self.policy.forward(rollout.prompts.clone()); // [B, n, V], with gradient
        let logp = loss::token_log_probs(logits.clone(), rollout.responses.clone(), temperature);
        let old_logp = if self.config.algorithm.bugs.unfrozen_old_policy {
            // BUG (gallery): π_old recomputed with gradient, so ρ ≡ 1 and its gradient vanishes.
            logp.clone()
        } else {
            rollout.old_logp.clone()
        };
        let last_of_iteration = self.step_in_iteration + 1 >= self.config.algorithm.mu;
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
                    .map(|c| c.to_vec())
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
        let entropy = loss::mean_entropy(logits.detach(), temperature);
        let mut grads = GradientsParams::from_grads(out.loss.clone().backward(), &self.policy);
        let grad_sq = self.policy.grad_norm_sq(&grads);
        // One read-back for every scalar of the step.
        let scalars: Vec<f32> = Tensor::cat(
            vec![
                out.loss.detach(),
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
        let max_norm = self.config.optimizer.max_grad_norm as f32;
        if max_norm > 0.0 && grad_norm > max_norm {
            grads = self.policy.scale_grads(grads, max_norm / grad_norm);
        }
        let lr = self.config.optimizer.lr;
        self.policy = self.optim.step(lr, self.policy.clone(), grads);

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
            min_length: stats.mean_length,
            max_length: stats.mean_length,
            loss: loss_v,
            kl,
            entropy,
            clip_ratio_low: clip_low,
            clip_ratio_high: clip_high,
            ratio_mean,
            grad_norm,
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
        }
        Ok(record)
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
        let state = serde_json::json!({
            "iteration": self.iteration,
            "global_step": self.global_step,
            "last_reward_mean": self.last_reward_mean,
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
        self.step_in_iteration = 0;
        self.rollout = None;
        Ok(())
    }
}
