//! One GRPO iteration, top to bottom, numbered as GRPO-SPEC §2 numbers its steps
//! ([`Trainer::run_iteration`]):
//!
//! 1. refresh the reference → (choose the prompts) → 2. roll out `[B·G]` responses →
//! 3. verify → 4. advantages → 5. log π_old / log π_ref `[B·G·T]`, frozen →
//! 6. `for _ in 0..μ { optimizer step }` → each step's record.
//!
//! (4 comes with 3 where nothing waits for it; after 5 where the KL goes into the reward, which
//! needs log π_old / log π_ref, or where dynamic sampling redraws flat groups.)
//! The app and the browser drive the same two parts one step at a time ([`Trainer::step`]);
//! an engine that runs the whole iteration on its device
//! ([`Engine::iteration`](crate::engine::Engine::iteration)) does steps
//! 2–6 in one submission, behind the same `Frozen` data (`roll_out_whole`).
//!
//! Everything that differs between compute paths is behind [`Engine`]; this file knows no
//! burn, no gemm, no wgpu (a test drives it with a fake engine).

use super::record::{self, PassAtK, RatioStats, Resampling, RolloutView, StepPosition};
use super::trainer::{Frozen, greedy_accuracy};
use super::{TrainError, Trainer};
use crate::config::{AdvantageMode, KlPenaltyMode, RewardAggregation};
use crate::engine::{Advantages, Batch, IterationRequest, SampleRequest, StepRequest, Which};
use crate::metrics::{GroupRecord, StepRecord};
use crate::objective::advantage;
use crate::objective::correction::{self, Correction};
use crate::objective::loss::{LossSettings, reference};
use crate::task::reward::{reward_components, score_batch};
use crate::task::tokenizer::EOS_ID;
use crate::task::{accuracy, is_exact};
use web_time::Instant;

/// Sampled and verified responses of some prompts, `G` per prompt.
#[derive(Default)]
pub(crate) struct Scored {
    pub rows: Vec<Vec<u32>>,
    pub closed: Vec<bool>,
    /// `[B·G]`
    pub rewards: Vec<f32>,
    /// `[B·G]`: 1 where the response is exactly sorted (and closed).
    pub exact: Vec<u32>,
    pub advantages: Option<Advantages>,
    /// The greedy answer to each prompt, when the engine had it for free.
    pub greedy: Option<Vec<Vec<u32>>>,
    /// `log π` of the sampled tokens at the sampling weights, when the engine had it.
    pub logp: Option<Vec<f32>>,
    /// The sampler's own log π of each token (the mismatch lab), when asked.
    pub sampler_logp: Option<Vec<f32>>,
    /// The sampler's support at each token (`sampling.keep_sampling_mask`), when asked.
    pub support: Option<Vec<u64>>,
}

/// What an iteration's rollout produced, before the record (either path).
struct Rolled {
    indices: Vec<usize>,
    scored: Scored,
    batch: Batch,
    adv: Advantages,
    driving: Vec<f32>,
    token_advantages: Option<Vec<f32>>,
    /// The critic's (squared error, explained variance); NaN without one.
    critic: (f32, f32),
    old_logp: Vec<f32>,
    ref_logp: Vec<f32>,
    resampling: Resampling,
    /// GDPO's reward collapse in this rollout (NaN for a single reward).
    collapsed: f32,
}

/// The advantages that drive an iteration's update: `[B·G]`, `[B·G·T]` where they differ per
/// token, and the critic's (squared error, explained variance) (NaN without one).
type Driving = (Vec<f32>, Option<Vec<f32>>, (f32, f32));

/// Zeroes the loss mask of every response that did not close (`[B·G·T]`): its tokens leave the
/// policy-gradient and KL terms and the aggregation's token counts; its length stays.
fn mask_rows(batch: &mut Batch, closed: &[bool]) {
    let t = batch.t.max(1);
    for (row, &closed) in batch.mask.chunks_mut(t).zip(closed) {
        if !closed {
            row.fill(0.0);
        }
    }
}

/// The sampler–learner gap of a rollout whose sampler log π was recorded.
fn gap_of(
    cfg: &crate::config::RunConfig,
    old_logp: &[f32],
    sampler_logp: Option<&[f32]>,
    adv: &[f32],
    batch: &Batch,
) -> Option<correction::GapStats> {
    let c = Correction::of(&cfg.algorithm);
    sampler_logp.map(|s| correction::gap_stats(&c, old_logp, s, adv, &batch.mask, batch.t))
}

/// Adds the time since the last lap to a slot.
struct Laps(Instant);

impl Laps {
    fn lap(&mut self, slot: &mut f64) {
        *slot += self.0.elapsed().as_secs_f64();
        self.0 = Instant::now();
    }
}

impl Trainer {
    /// Steps 1–5 of GRPO-SPEC §2 for the current iteration: its frozen data.
    pub(super) fn roll_out(&mut self) -> Result<Frozen, TrainError> {
        self.cold_start()?;
        let cfg = self.config.clone();
        let a = &cfg.algorithm;
        let g = a.num_generations;
        let iteration = self.iteration;
        let mut laps = Laps(Instant::now());
        // 1. Reference ← a real copy of the policy, every `ref_period` iterations.
        if iteration > 0 && a.ref_period > 0 && iteration.is_multiple_of(a.ref_period) {
            self.engine.refresh_reference();
        }
        // Stale rollouts: this policy kept as a later iteration's sampler.
        self.remember_policy()?;
        // Choose the prompts (`[B]` indices into the training split).
        let mut indices = self.sampler.indices(&cfg, iteration);
        if self.runs_whole() {
            return self.roll_out_whole(indices, laps);
        }
        // 2. Roll out G responses per prompt from π_old, and 3. verify them (with the
        // advantages on the device when they do not wait for anything else).
        let kl_in_reward = a.kl_penalty == KlPenaltyMode::Reward && a.beta > 0.0;
        let gdpo = cfg.task.reward_aggregation == RewardAggregation::NormalizeThenSum;
        let advantages_now =
            !kl_in_reward && !gdpo && !a.dynamic_sampling && !a.bugs.std_without_eps;
        let mut scored = self.sample_and_verify(&indices, iteration as u32, advantages_now)?;
        let resampling = self.resample_flat_groups(&mut indices, &mut scored)?;
        laps.lap(&mut self.timings.rollout);

        // 5. log π_old and log π_ref of every sampled token, frozen (over the sampler's
        // support when the learner keeps it).
        let mut batch = self.batch_of(&indices, &scored.rows, g);
        batch.support = scored.support.take();
        let (old_logp, ref_logp) = self.learner_logp(&mut scored, &batch)?;
        laps.lap(&mut self.timings.old_ref_logp);

        // 4. Advantages from the scores (minus β·KL when the KL goes into the reward; GDPO's
        // sum of group-normalized rewards), every group mode for the same rewards, `[B·G]`; one
        // estimator drives the update.
        let penalized =
            kl_in_reward.then(|| self.kl_penalized(&scored.rewards, &batch, &old_logp, &ref_logp));
        let parts = self.reward_parts(&indices, &scored.rows, gdpo);
        let normalized_sum = parts
            .as_ref()
            .filter(|_| gdpo)
            .map(|p| advantage::normalize_then_sum(p, g));
        let rewards = penalized
            .as_deref()
            .or(normalized_sum.as_deref())
            .unwrap_or(&scored.rewards);
        let adv = match scored.advantages.take() {
            Some(adv) => adv,
            None => self.advantages(rewards, g)?,
        };
        let (driving, token_advantages, critic) = self.driving_advantages(
            &adv,
            rewards,
            &scored.exact,
            &mut scored.greedy,
            &batch,
            &indices,
        )?;
        // DAPO's overlong filtering: the cut responses leave the loss (after their rewards went
        // into the advantages, the KL-in-reward and the critic, which read the real tokens).
        if a.mask_truncated_completions {
            mask_rows(&mut batch, &scored.closed);
        }
        let collapsed = parts
            .as_ref()
            .filter(|p| p.len() > 1)
            .map_or(f32::NAN, |p| advantage::collapsed_pairs(p, &driving, g));
        laps.lap(&mut self.timings.advantages);

        let accuracy_heldout = self.heldout_accuracy()?;
        let pass = self.pass_at_k(iteration)?;
        self.freeze(
            Rolled {
                indices,
                scored,
                batch,
                adv,
                driving,
                token_advantages,
                critic,
                old_logp,
                ref_logp,
                resampling,
                collapsed,
            },
            accuracy_heldout,
            pass,
            laps,
        )
    }

    /// Step 5: log π_old and log π_ref `[B·G·T]` as the learner scores them — the sampling
    /// pass's own log π serves where the learner scores what the sampler drew from — and a
    /// check that the sampler's own log π came where the mismatch lab records it.
    fn learner_logp(
        &mut self,
        scored: &mut Scored,
        batch: &Batch,
    ) -> Result<(Vec<f32>, Vec<f32>), TrainError> {
        let cfg = &self.config;
        let temperature = cfg.sampling.learner_temperature() as f32;
        let drawn_at_learner_temperature = temperature == cfg.sampling.temperature as f32;
        if cfg.records_sampler_logp() && scored.sampler_logp.is_none() {
            return Err(crate::engine::EngineError::Unsupported(format!(
                "{} returned no sampler log π",
                self.engine.label()
            ))
            .into());
        }
        let shared_reference = cfg.algorithm.bugs.shared_reference;
        let old_logp = match scored.logp.take().filter(|_| drawn_at_learner_temperature) {
            Some(logp) => logp,
            None => self.engine.token_logp(Which::Policy, batch, temperature)?,
        };
        let ref_logp = if shared_reference {
            // BUG (gallery): the "reference" is the policy itself, so it moves every iteration.
            old_logp.clone()
        } else {
            self.engine
                .token_logp(Which::Reference, batch, temperature)?
        };
        Ok((old_logp, ref_logp))
    }

    /// Each reward apart (`reward_components`) where the reward is a mixture — several
    /// verifiers, or (the transformer) a format or length term beside the verifier — for GDPO
    /// and the record's collapse count; for GDPO (`gdpo`) a single reward too (its one term,
    /// normalized in its group as TRL's `normalize_then_sum` does); else `None` for one.
    fn reward_parts(
        &self,
        indices: &[usize],
        rows: &[Vec<u32>],
        gdpo: bool,
    ) -> Option<Vec<(f32, Vec<f32>)>> {
        let t = &self.config.task;
        let shaped = self.is_autoregressive()
            && (t.format_reward != 0.0 || t.length_reward != crate::config::LengthReward::None);
        let g = self.config.algorithm.num_generations;
        (self.reward_fn.terms() > 1 || shaped || gdpo).then(|| {
            let prompts = self.prompts_of(indices);
            reward_components(&self.reward_fn, &self.config, &prompts, rows, g)
        })
    }

    /// The whole iteration on the engine's device in one submission ([`Engine::iteration`]):
    /// held-out evaluation first (it reads the weights before the iteration's steps, as the
    /// split path does), then rollout, verifying, advantages, log π_old / log π_ref and the μ
    /// optimizer steps, whose outputs [`Trainer::step`] hands out one at a time.
    ///
    /// [`Engine::iteration`]: crate::engine::Engine::iteration
    fn roll_out_whole(
        &mut self,
        indices: Vec<usize>,
        mut laps: Laps,
    ) -> Result<Frozen, TrainError> {
        let cfg = self.config.clone();
        let a = &cfg.algorithm;
        let g = a.num_generations;
        let iteration = self.iteration;
        let (accuracy_heldout, pass) = match self.pre_eval.take() {
            Some((it, accuracy, pass)) if it == iteration => (accuracy, pass),
            _ => (self.heldout_accuracy()?, self.pass_at_k(iteration)?),
        };
        laps.lap(&mut self.timings.evaluation);
        let prompts: Vec<&[u32]> = indices
            .iter()
            .map(|&i| self.prompts.train[i].as_slice())
            .collect();
        let mode = a.advantage.group_index().unwrap_or(0);
        let logged = indices.len().min(cfg.run.log_groups);
        let asked = self.engine.iteration(&IterationRequest {
            sample: SampleRequest {
                prompts: &prompts,
                g,
                max_len: cfg.max_len(),
                params: crate::objective::sampling::SamplingParams::of(&cfg.sampling),
                seed: cfg.run.seed,
                stream: iteration as u32,
                sampler: crate::engine::SamplerSide::default(),
                verify: None,
            },
            reward_weights: self.reward_fn.kernel_weights(),
            mode,
            loss: LossSettings::of(&cfg),
            temperature: cfg.sampling.temperature as f32,
            lr: cfg.optimizer.lr,
            max_grad_norm: cfg.optimizer.max_grad_norm as f32,
            mu: a.mu,
            logp_rows: logged * g,
        });
        let out = match asked {
            // Still on the device (a browser): keep the evaluation for the same request on
            // a later frame.
            Err(crate::engine::EngineError::Pending) => {
                self.pre_eval = Some((iteration, accuracy_heldout, pass));
                return Err(crate::engine::EngineError::Pending.into());
            }
            other => other?,
        };
        // The steps are most of it: the whole submission counts as step time.
        laps.lap(&mut self.timings.step);
        let incomplete = |what: &str| {
            crate::engine::EngineError::Unsupported(format!(
                "{} ran an iteration without {what}",
                self.engine.label()
            ))
        };
        let samples = out.samples;
        let scores = samples.scores.ok_or_else(|| incomplete("scores"))?;
        let adv = scores.advantages.ok_or_else(|| incomplete("advantages"))?;
        let old_logp = samples.logp.ok_or_else(|| incomplete("log π_old"))?;
        if out.steps.len() != a.mu {
            return Err(incomplete("its μ steps").into());
        }
        let batch = self.batch_of(&indices, &samples.rows, g);
        let driving = adv.by_mode[mode].clone();
        let zero_std_first_draw =
            adv.zero_std.iter().filter(|&&z| z).count() as f32 / indices.len().max(1) as f32;
        self.pending = out.steps.into();
        self.freeze(
            Rolled {
                indices,
                scored: Scored {
                    rows: samples.rows,
                    closed: samples.closed,
                    rewards: scores.rewards,
                    exact: scores.exact,
                    greedy: samples.greedy,
                    ..Default::default()
                },
                batch,
                adv,
                driving,
                token_advantages: None,
                critic: (f32::NAN, f32::NAN),
                old_logp,
                ref_logp: out.ref_logp,
                resampling: Resampling {
                    zero_std_first_draw,
                    ..Default::default()
                },
                collapsed: f32::NAN,
            },
            accuracy_heldout,
            pass,
            laps,
        )
    }

    /// Whether this iteration runs whole on the engine's device: the engine can, and nothing
    /// in the iteration needs the host between its parts (dynamic sampling's redraws, the KL
    /// in the reward, GAE's critic, the bug switches).
    fn runs_whole(&self) -> bool {
        let a = &self.config.algorithm;
        let b = &a.bugs;
        self.engine.runs_iterations()
            && !a.dynamic_sampling
            && !(a.kl_penalty == KlPenaltyMode::Reward && a.beta > 0.0)
            && AdvantageMode::GROUP.contains(&a.advantage)
            && self.config.task.reward_aggregation == RewardAggregation::SumThenNormalize
            && a.positive_weight == 1.0
            && a.negative_weight == 1.0
            && a.steps_per_generation == 1
            && a.replay_buffer == 0
            && !a.entropy_bonus()
            && !(b.std_without_eps || b.shared_reference || b.unfrozen_old_policy)
    }

    /// Greedy accuracy, the record's statistics and logged groups, and the frozen data of the
    /// iteration's steps.
    fn freeze(
        &mut self,
        r: Rolled,
        accuracy_heldout: Option<f32>,
        pass: Option<PassAtK>,
        mut laps: Laps,
    ) -> Result<Frozen, TrainError> {
        let cfg = self.config.clone();
        let g = cfg.algorithm.num_generations;
        let Rolled {
            indices,
            mut scored,
            batch,
            adv,
            driving,
            token_advantages,
            critic,
            old_logp,
            ref_logp,
            resampling,
            collapsed,
        } = r;
        // Prioritized sampling remembers each prompt's success rate; greedy accuracy.
        self.sampler.record(&indices, &scored.exact, g);
        let prompts: Vec<&[u32]> = indices
            .iter()
            .map(|&i| self.prompts.train[i].as_slice())
            .collect();
        let accuracy_train = match &scored.greedy {
            Some(greedy) => accuracy(&cfg, &prompts, greedy),
            None => greedy_accuracy(self.engine.as_mut(), &cfg, &prompts)?,
        };
        laps.lap(&mut self.timings.evaluation);

        self.rollouts += (batch.b + resampling.groups) * g;

        let mut stats = record::rollout_stats(
            &RolloutView {
                rewards: &scored.rewards,
                exact: &scored.exact,
                closed: &scored.closed,
                lengths: &batch.lengths,
                driving: &driving,
                zero_std: &adv.zero_std,
                correct_len: cfg.task.n + usize::from(self.is_autoregressive()),
            },
            resampling,
            accuracy_train,
            accuracy_heldout,
        );
        stats.rollouts = self.rollouts;
        stats.pass = pass;
        stats.reward_collapsed_pairs = collapsed;
        let adv_t = token_advantages.as_deref().unwrap_or(&driving);
        stats.gap = gap_of(
            &cfg,
            &old_logp,
            scored.sampler_logp.as_deref(),
            adv_t,
            &batch,
        );
        (stats.value_loss, stats.value_explained_var) = critic;
        let logged = batch.b.min(cfg.run.log_groups);
        let groups = (cfg.run.log_groups > 0).then(|| {
            let shown: Vec<Vec<u32>> = scored.rows[..logged * g]
                .iter()
                .map(|r| self.shown(r))
                .collect();
            record::logged_groups(
                logged,
                g,
                &indices,
                &prompts,
                &shown,
                &scored.rewards,
                &adv.by_mode,
                &driving,
                &adv.zero_std,
            )
        });
        self.last_reward_mean = stats.reward_mean;
        let mut frozen = Frozen {
            batch,
            advantages: driving,
            old_logp,
            ref_logp,
            stats,
            groups,
            token_advantages,
            replaced: Vec::new(),
            seen: None,
            sampler_logp: scored.sampler_logp,
        };
        if cfg.algorithm.replay_buffer > 0 {
            self.replay_frozen(&mut frozen, &scored.rewards, &adv.zero_std);
        }
        // The responses' thousands of small buffers, back to the engine (to reuse or free).
        self.engine.recycle_rows(std::mem::take(&mut scored.rows));
        Ok(frozen)
    }

    /// The replay buffer's turn on the frozen batch ([`Self::replay_into`]), counted in its
    /// record.
    fn replay_frozen(&mut self, frozen: &mut Frozen, rewards: &[f32], zero_std: &[bool]) {
        frozen.replaced = self.replay_into(frozen, rewards, zero_std);
        let count = frozen.replaced.iter().filter(|&&r| r).count();
        frozen.stats.replay = Some((count, self.replay.groups.len()));
    }

    /// The advantages that drive the update, `[B·G]` (and `[B·G·T]` where they differ per
    /// token), W-REINFORCE's weights applied: a group mode's from `adv`; PPO's per-token GAE
    /// from the critic (trained here on the returns; its per-response mean stands for it in
    /// the record, with the critic's fit); the other estimators from `objective::advantage`
    /// (ReMax scores the greedy answers, kept for the greedy accuracy).
    fn driving_advantages(
        &mut self,
        adv: &Advantages,
        rewards: &[f32],
        exact: &[u32],
        greedy: &mut Option<Vec<Vec<u32>>>,
        batch: &Batch,
        indices: &[usize],
    ) -> Result<Driving, TrainError> {
        let a = self.config.algorithm.clone();
        let g = a.num_generations;
        let per_response = |tokens: &[f32]| -> Vec<f32> {
            tokens
                .chunks(batch.t.max(1))
                .zip(&batch.lengths)
                .map(|(c, &len)| c[..len.min(c.len())].iter().sum::<f32>() / len.max(1) as f32)
                .collect()
        };
        let no_critic = (f32::NAN, f32::NAN);
        let (mut driving, mut tokens, critic) = match a.advantage {
            AdvantageMode::Gae => {
                let (tokens, critic) = self.gae_advantages(batch, rewards);
                (per_response(&tokens), Some(tokens), critic)
            }
            AdvantageMode::ReinforcePp if a.gamma < 1.0 => {
                let tokens = advantage::reinforce_pp_tokens(
                    rewards,
                    &batch.lengths,
                    batch.t,
                    a.gamma as f32,
                );
                (per_response(&tokens), Some(tokens), no_critic)
            }
            m if let Some(k) = m.group_index() => (adv.by_mode[k].clone(), None, no_critic),
            m => {
                let greedy_rewards = if m == AdvantageMode::Remax {
                    Some(self.greedy_rewards(indices, greedy)?)
                } else {
                    None
                };
                let x = advantage::Rollouts {
                    rewards,
                    g,
                    lengths: &batch.lengths,
                    exact,
                    greedy_rewards: greedy_rewards.as_deref(),
                    passk_k: a.passk_advantage_k,
                };
                (advantage::estimate(m, &x), None, no_critic)
            }
        };
        let (pos, neg) = (a.positive_weight as f32, a.negative_weight as f32);
        advantage::weight_by_sign(&mut driving, pos, neg);
        if let Some(t) = tokens.as_mut() {
            advantage::weight_by_sign(t, pos, neg);
        }
        Ok((driving, tokens, critic))
    }

    /// ReMax's baseline: the reward of each prompt's greedy answer (`[B]`), the answers kept in
    /// `kept` for the greedy accuracy.
    fn greedy_rewards(
        &mut self,
        indices: &[usize],
        kept: &mut Option<Vec<Vec<u32>>>,
    ) -> Result<Vec<f32>, TrainError> {
        let cfg = self.config.clone();
        let train = &self.prompts.train;
        let prompts: Vec<&[u32]> = indices.iter().map(|&i| train[i].as_slice()).collect();
        let greedy = match kept.take() {
            Some(greedy) => greedy,
            None => self.engine.greedy(&prompts, cfg.max_len())?,
        };
        let (rewards, _) = score_batch(&self.reward_fn, &cfg, &prompts, &greedy, 1);
        *kept = Some(greedy);
        Ok(rewards)
    }

    /// The training prompts `indices`, `[B]`.
    fn prompts_of(&self, indices: &[usize]) -> Vec<&[u32]> {
        indices
            .iter()
            .map(|&i| self.prompts.train[i].as_slice())
            .collect()
    }

    /// GAE(γ, λ) per token from the critic's values, then the critic's regression on the
    /// returns; the advantages whitened over the batch. Returns them and the critic's (squared
    /// error before its update, explained variance).
    fn gae_advantages(&mut self, batch: &Batch, rewards: &[f32]) -> (Vec<f32>, (f32, f32)) {
        use crate::objective::value::{explained_variance, gae, whiten};
        let a = self.config.algorithm.clone();
        if self.critic.is_none() {
            self.critic = Some(self.new_critic());
        }
        let critic = self.critic.as_mut().expect("made above");
        let values = critic.values(batch);
        let (mut adv, returns) = gae(
            rewards,
            &values,
            &batch.lengths,
            batch.t,
            a.gamma as f32,
            a.lam as f32,
        );
        let explained = explained_variance(&values, &returns, &batch.mask);
        let loss = critic.fit(batch, &returns, a.value_lr as f32, a.value_epochs);
        whiten(&mut adv, &batch.mask);
        (adv, (loss, explained))
    }

    /// One GRPO iteration, GRPO-SPEC §2 top to bottom, each record handed to `sink` as its
    /// step ends (`sink` returns false to stop at once, the iteration left unfinished: a second
    /// Ctrl-C). The CLI's run loop calls this; the app and the browser drive [`Self::step`], one
    /// step at a time over the same two parts.
    pub fn run_iteration(
        &mut self,
        mut sink: impl FnMut(StepRecord) -> bool,
    ) -> Result<(), TrainError> {
        let mut started = Instant::now();
        // 1–5. The reference, the rollout, the verifier, the advantages, log π_old / log π_ref:
        // the iteration's frozen data (`[B·G·T]`).
        if self.frozen.is_none() {
            self.frozen = Some(self.roll_out()?);
        }
        // 6. μ passes of optimizer steps over the frozen batch's `steps_per_generation`
        // mini-batches (one step on the whole batch per pass by default).
        for _ in self.step_in_iteration..self.config.algorithm.steps_per_iteration() {
            let record = self.optimizer_step(started)?;
            if !sink(record) {
                break;
            }
            // The next step's time starts after this record was handed on (written, sent).
            started = Instant::now();
        }
        Ok(())
    }

    /// One optimizer step, rolling out first when an iteration begins: what the app and the
    /// browser drive, a frame at a time.
    pub fn step(&mut self) -> Result<StepRecord, TrainError> {
        let started = Instant::now();
        if self.frozen.is_none() {
            self.frozen = Some(self.roll_out()?);
        }
        self.optimizer_step(started)
    }

    /// Step 6's optimizer step on the frozen batch (or its mini-batch), and its record (its
    /// time counted from `started`: the iteration's first step carries the rollout's); the
    /// iteration ends with its μ·steps_per_generation-th.
    fn optimizer_step(&mut self, started: Instant) -> Result<StepRecord, TrainError> {
        // A config changed live (the app's Apply) to something this engine does not cover
        // (a bug switch, the entropy bonus) moves the run to an engine that does.
        self.ensure_engine_supports_config()?;
        let cfg = &self.config;
        let a = &cfg.algorithm;
        let last_of_iteration = self.step_in_iteration + 1 >= a.steps_per_iteration();
        let frozen = self.frozen.as_ref().expect("rolled out above");
        let g = frozen.batch.g;
        let logged = frozen.groups.as_ref().map_or(0, |gr| gr.len());
        let step_started = Instant::now();
        // This step's mini-batch (a copy of its groups' rows when the batch is split).
        let parts = frozen.parts(a.steps_per_generation);
        let part = (parts > 1).then(|| frozen.part(self.step_in_iteration % parts, parts));
        let (batch, advantages, token_advantages, old_logp, ref_logp, sampler_logp) =
            frozen.view(part.as_ref());
        // Every row's log π at each step (the ratio's range, KL(π_old ‖ π)); an engine that
        // batches an iteration's steps on a device returns only the last step's logged rows
        // (NaN statistics on the others; with mini-batches it takes them one at a time).
        let batched = self.engine.batches_steps() && parts == 1;
        let rows = if batched { logged * g } else { batch.b * g };
        // The step's own random stream (Clip-Cov's draw): a function of seed, iteration, step.
        let stream = crate::rng::counter_u32(
            cfg.run.seed,
            &[self.iteration as u32, self.step_in_iteration as u32, 0xC0C0],
        );
        let mut loss = LossSettings::of(cfg).with_stream(stream as u64);
        loss.entropy_coef = self.entropy_control.applied(a) as f32;
        let req = StepRequest {
            loss,
            temperature: cfg.sampling.learner_temperature() as f32,
            lr: cfg.optimizer.lr,
            max_grad_norm: cfg.optimizer.max_grad_norm as f32,
            advantages,
            token_advantages,
            old_logp,
            ref_logp,
            sampler_logp,
            logp_rows: rows,
            // A mini-batch's rows (`Frozen::saw`), the logged groups at the iteration's end.
            entropy_rows: match (&part, last_of_iteration) {
                (Some(_), _) => rows,
                (None, true) => logged * g,
                (None, false) => 0,
            },
            entropy_dynamics: cfg.run.entropy_dynamics,
        };
        // An engine that takes the iteration's steps in one go (one submission): all of them
        // on the first call, handed out one per call.
        let all_at_once = (batched && !last_of_iteration)
            .then(|| a.steps_per_iteration() - self.step_in_iteration);
        let out = next_output(
            self.engine.as_mut(),
            &mut self.pending,
            batch,
            &req,
            all_at_once,
        )?;
        let ratio = RatioStats::on(&self.engine.cores(), &out.logp, old_logp, &batch.mask);
        let covariance = (cfg.run.entropy_dynamics)
            .then(|| record::covariance(&out.logp, advantages, token_advantages, batch))
            .flatten();
        self.timings.step += step_started.elapsed().as_secs_f64();
        let sc = out.scalars;
        let step = self.global_step + 1;
        // A diverged step makes its record (its error carries it) but moves no state.
        let diverged = finite(&sc, step, self.iteration).err();
        let frozen = self.frozen.as_mut().expect("rolled out above");
        if diverged.is_none() {
            self.entropy_control.update(sc.entropy as f64, a);
            part.inspect(|p| frozen.saw(p.rows.clone(), &out.logp, &out.entropy));
        }
        let groups = (last_of_iteration && logged > 0).then(|| frozen.groups_after(&out));
        let mut record = record::step_record(
            StepPosition {
                iteration: self.iteration,
                step,
                step_in_iteration: self.step_in_iteration,
                lr: cfg.optimizer.lr,
                step_time_secs: started.elapsed().as_secs_f64(),
            },
            &frozen.stats,
            &sc,
            ratio,
            groups,
        );
        if a.loss == crate::config::LossMode::Cispo {
            record.cispo_clip_ratio = Some(record.clip_ratio_high);
        }
        record::with_covariance(&mut record, covariance, cfg);
        if a.entropy_bonus() {
            record.entropy_coef = Some(self.entropy_control.coef as f32);
        }
        if let Some(e) = diverged {
            return Err(with_record(e, record));
        }
        self.advance(step);
        Ok(record)
    }

    /// After step `step`: the next step's position, the iteration's frozen data dropped at its end.
    fn advance(&mut self, step: usize) {
        self.global_step = step;
        self.step_in_iteration += 1;
        if self.step_in_iteration >= self.config.algorithm.steps_per_iteration() {
            self.step_in_iteration = 0;
            self.iteration += 1;
            self.frozen = None;
            self.pending.clear();
            self.engine.end_iteration();
        }
    }
}

/// A diverged step's error, carrying the step's record (the run logs it).
fn with_record(e: TrainError, record: crate::metrics::StepRecord) -> TrainError {
    match e {
        TrainError::NonFinite {
            step,
            iteration,
            value,
            ..
        } => TrainError::NonFinite {
            step,
            iteration,
            value,
            record: Some(Box::new(record)),
        },
        e => e,
    }
}

/// A diverged step (a non-finite loss or gradient norm) stops the run, saying which.
fn finite(
    sc: &crate::engine::StepScalars,
    step: usize,
    iteration: usize,
) -> Result<(), TrainError> {
    if sc.loss.is_finite() && sc.grad_norm.is_finite() {
        return Ok(());
    }
    let value = if sc.loss.is_finite() {
        sc.grad_norm
    } else {
        sc.loss
    };
    Err(TrainError::NonFinite {
        step,
        iteration,
        value,
        record: None,
    })
}

/// [`score_batch`] by spans of whole groups (about [`SCORE_SPAN`] responses) on `cores`'
/// threads: each response's reward and flag are its own (a group's, for Kimi's length term),
/// so the same values on any number of threads.
fn score_on(
    cores: &crate::engine::cores::Cores,
    f: &crate::task::reward::RewardFn,
    c: &crate::config::RunConfig,
    prompts: &[&[u32]],
    rows: &[Vec<u32>],
    g: usize,
) -> (Vec<f32>, Vec<u32>) {
    let g = g.max(1);
    let groups = (SCORE_SPAN / g).max(1);
    if cores.threads() == 1 || prompts.len() <= groups {
        return score_batch(f, c, prompts, rows, g);
    }
    let mut spans: Vec<(usize, Scores)> = (0..prompts.len())
        .step_by(groups)
        .map(|p| (p, Default::default()))
        .collect();
    cores.each(&mut spans, |_, (p, out)| {
        let ps = *p..(*p + groups).min(prompts.len());
        let rs = ps.start * g..(ps.end * g).min(rows.len());
        *out = score_batch(f, c, &prompts[ps], &rows[rs], g);
    });
    let (mut rewards, mut exact) = (
        Vec::with_capacity(rows.len()),
        Vec::with_capacity(rows.len()),
    );
    for (_, (r, e)) in spans {
        rewards.extend(r);
        exact.extend(e);
    }
    (rewards, exact)
}

/// A span's rewards and exact-match flags.
type Scores = (Vec<f32>, Vec<u32>);

/// About this many responses to a thread in [`score_on`].
const SCORE_SPAN: usize = 512;

/// The step's output: the next of the iteration's steps an engine took in one go, or — with
/// `all_at_once = Some(count)` — `count` steps at once (the first returned, the rest kept in
/// `pending`), or one step.
fn next_output(
    engine: &mut (dyn crate::engine::Engine + Send),
    pending: &mut std::collections::VecDeque<crate::engine::StepOutput>,
    batch: &Batch,
    req: &StepRequest,
    all_at_once: Option<usize>,
) -> Result<crate::engine::StepOutput, TrainError> {
    if let Some(out) = pending.pop_front() {
        return Ok(out);
    }
    let Some(count) = all_at_once else {
        return Ok(engine.step(batch, req)?);
    };
    let mut outs: std::collections::VecDeque<_> = engine.steps(batch, req, count)?.into();
    let first = outs.pop_front().ok_or_else(|| {
        crate::engine::EngineError::Unsupported(format!(
            "{} returned no steps for {count} asked",
            engine.label()
        ))
    })?;
    *pending = outs;
    Ok(first)
}

impl Frozen {
    /// The logged groups as the iteration's last step `out` left them (each mini-batch's rows
    /// as its latest step read them, where the batch was split).
    fn groups_after(&self, out: &crate::engine::StepOutput) -> Vec<GroupRecord> {
        match &self.seen {
            Some((logp, entropy)) => self.groups_at(logp, entropy),
            None => self.groups_at(&out.logp, &out.entropy),
        }
    }

    /// The logged groups with their per-token log π and entropy (`logp`, `entropy`: after the
    /// iteration's μ − 1 updates, as the last step reads them; `entropy` may be empty), log π_old
    /// and log π_ref, for the iteration's last record.
    fn groups_at(&self, logp: &[f32], entropy: &[f32]) -> Vec<GroupRecord> {
        let mut groups = self.groups.clone().unwrap_or_default();
        let (t, g) = (self.batch.t, self.batch.g);
        let rows = |x: &[f32]| -> Vec<Vec<f32>> {
            x.chunks(t)
                .take(groups.len() * g)
                .zip(&self.batch.lengths)
                .map(|(c, &len)| c[..len.min(t)].to_vec())
                .collect()
        };
        let (logp, old_logp, ref_logp) = (rows(logp), rows(&self.old_logp), rows(&self.ref_logp));
        let entropy = rows(entropy);
        for (i, group) in groups.iter_mut().enumerate() {
            // A group the replay buffer replaced was not trained on: its rows hold another's.
            if self.replaced.get(i).copied().unwrap_or(false) {
                continue;
            }
            let span = i * g..(i + 1) * g;
            group.logp = logp[span.clone()].to_vec();
            group.old_logp = old_logp[span.clone()].to_vec();
            group.ref_logp = ref_logp[span.clone()].to_vec();
            if entropy.len() >= span.end {
                group.entropy = entropy[span].to_vec();
            }
        }
        groups
    }
}

impl Trainer {
    /// Sample `G` responses to each of the training prompts `indices` and verify them (on the
    /// engine's device when it verifies there), with every advantage mode if `advantages`.
    pub(super) fn sample_and_verify(
        &mut self,
        indices: &[usize],
        stream: u32,
        advantages: bool,
    ) -> Result<Scored, TrainError> {
        let cfg = &self.config;
        let g = cfg.algorithm.num_generations;
        // Owned: the request must not borrow `self` (a stale sampler swaps the engine's state);
        // in one buffer (a clone of each prompt was hundreds of allocations an iteration).
        let train = &self.prompts.train;
        let mut owned: Vec<u32> = Vec::with_capacity(indices.iter().map(|&i| train[i].len()).sum());
        let mut ends = Vec::with_capacity(indices.len());
        for &i in indices {
            owned.extend_from_slice(&train[i]);
            ends.push(owned.len());
        }
        let starts = std::iter::once(0).chain(ends.iter().copied());
        let prompts: Vec<&[u32]> = starts.zip(&ends).map(|(a, &b)| &owned[a..b]).collect();
        let s = &cfg.sampling;
        let req = SampleRequest {
            prompts: &prompts,
            g,
            max_len: cfg.max_len(),
            params: crate::objective::sampling::SamplingParams::of(s),
            seed: cfg.run.seed,
            stream,
            sampler: crate::engine::SamplerSide::of(cfg),
            verify: Some((self.reward_fn.kernel_weights(), advantages)),
        };
        // An older policy's draws (stale rollouts): its log π and greedy answers are not the
        // learner's.
        let (samples, stale) = self.sample_as_sampler(&req)?;
        let cfg = &self.config;
        let (rewards, exact, device_advantages) = match samples.scores {
            Some(s) => (s.rewards, s.exact, s.advantages),
            None => {
                let cores = self.engine.cores();
                let (r, e) = score_on(&cores, &self.reward_fn, cfg, &prompts, &samples.rows, g);
                (r, e, None)
            }
        };
        let mut scored = Scored {
            rows: samples.rows,
            closed: samples.closed,
            rewards,
            exact,
            advantages: device_advantages,
            greedy: samples.greedy.filter(|_| !stale),
            logp: samples.logp.filter(|_| !stale),
            sampler_logp: samples.sampler_logp,
            support: samples.support,
        };
        if advantages && scored.advantages.is_none() {
            scored.advantages = Some(self.advantages(&scored.rewards, g)?);
        }
        Ok(scored)
    }

    /// Held-out pass@1 / pass@4 / pass@k when this iteration evaluates them (every
    /// `run.eval_every`, from iteration 0): `run.pass_samples` answers per held-out prompt sampled at the
    /// run's sampling settings from a stream of their own (the training draws do not move).
    fn pass_at_k(&mut self, iteration: usize) -> Result<Option<PassAtK>, TrainError> {
        let cfg = &self.config;
        let r = &cfg.run;
        // Not "and at the last iteration": which iteration is last changes when a resumed run
        // is lengthened, and a resumed run must log what the uninterrupted one does.
        let due = r.eval_every > 0 && iteration.is_multiple_of(r.eval_every);
        if !due || self.prompts.heldout.is_empty() {
            return Ok(None);
        }
        let k = r.pass_k;
        let n = if r.pass_samples == 0 {
            k
        } else {
            r.pass_samples
        };
        let prompts: Vec<&[u32]> = self.prompts.heldout.iter().map(|p| p.as_slice()).collect();
        let mut sums = [0f64; 3];
        // 64 prompts at a time: the n answers of 256 prompts at once would hold their whole
        // rollout (a transformer's KV cache) in memory together.
        for (chunk, part) in prompts.chunks(64).enumerate() {
            let samples = self.engine.sample(&SampleRequest {
                prompts: part,
                g: n,
                max_len: cfg.max_len(),
                params: crate::objective::sampling::SamplingParams::of(&cfg.sampling),
                seed: cfg.run.seed,
                stream: crate::rng::counter_u32(
                    cfg.run.seed,
                    &[iteration as u32, 0xE7A1, chunk as u32],
                ),
                sampler: crate::engine::SamplerSide::default(),
                verify: None,
            })?;
            for (pi, prompt) in part.iter().enumerate() {
                let c = samples.rows[pi * n..(pi + 1) * n]
                    .iter()
                    .filter(|row| is_exact(cfg, prompt, row))
                    .count();
                for (sum, kk) in sums.iter_mut().zip([1, 4, k]) {
                    *sum += record::pass_at_k(n, c, kk);
                }
            }
        }
        let mean = |x: f64| (x / prompts.len() as f64) as f32;
        Ok(Some(PassAtK {
            at_1: mean(sums[0]),
            at_4: (n >= 4).then(|| mean(sums[1])),
            at_k: mean(sums[2]),
        }))
    }

    /// Every advantage mode for `[B·G]` rewards: on the engine's device where it has kernels
    /// for them, else the reference formulas.
    fn advantages(&mut self, rewards: &[f32], g: usize) -> Result<Advantages, TrainError> {
        let no_eps = self.config.algorithm.bugs.std_without_eps;
        if !no_eps && let Some(done) = self.engine.device_advantages(rewards, g) {
            return Ok(done?);
        }
        // Every group mode (`advantage::all_advantages`), a mode to a thread where the batch
        // is worth it.
        let mut by_mode: Vec<Vec<f32>> = vec![Vec::new(); AdvantageMode::GROUP.len()];
        let work = rewards.len() * by_mode.len();
        self.engine
            .cores()
            .each_worth(work, &mut by_mode, |k, out| {
                *out = advantage::advantages(AdvantageMode::GROUP[k], rewards, g);
            });
        if no_eps {
            // BUG (gallery): (r − mean) / std with no ε.
            let k = AdvantageMode::GROUP
                .iter()
                .position(|m| *m == AdvantageMode::Normalized)
                .unwrap_or(0);
            by_mode[k] = advantage::normalized_without_eps(rewards, g);
        }
        Ok(Advantages {
            zero_std: (rewards.chunks(g))
                .map(|r| advantage::GroupStats::of(r).zero_std)
                .collect(),
            by_mode,
        })
    }

    /// PPO-RLHF style: `r − β·Σ_t KL_t(π_old ‖ π_ref)` per response, over its real tokens.
    fn kl_penalized(&self, rewards: &[f32], batch: &Batch, old: &[f32], refl: &[f32]) -> Vec<f32> {
        let a = &self.config.algorithm;
        reference::kl_penalized_rewards(
            rewards,
            &batch.mask,
            old,
            refl,
            a.kl_estimator,
            a.beta as f32,
        )
    }

    /// The frozen batch of the chosen prompts and their responses, padded to the longest.
    fn batch_of(&self, indices: &[usize], rows: &[Vec<u32>], g: usize) -> Batch {
        let n = self.config.task.n;
        let prompts: Vec<u32> = indices
            .iter()
            .flat_map(|&i| self.prompts.train[i].iter().copied())
            .collect();
        // By spans of the rows as the engine made them, on its threads.
        let cores = self.engine.cores();
        let span = crate::engine::cores::ROWS_SPAN;
        Batch::padded_by(prompts, n, rows, g, self.eos(), span, |spans| {
            let work = rows.len() * n;
            cores.each_worth(work, spans, |_, s| s.fill());
        })
    }

    /// A response as the record shows it: `<eos>` as the tokenizer's id, so it decodes as `<eos>`.
    fn shown(&self, r: &[u32]) -> Vec<u32> {
        let eos = self.eos();
        let ar = self.is_autoregressive();
        r.iter()
            .map(|&x| if ar && x == eos { EOS_ID } else { x })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LengthReward, RunConfig};
    use crate::engine::cores::Cores;
    use crate::rng::SplitMix64;
    use crate::task::reward::RewardFn;

    /// The rewards scored by spans of groups on 2 and 3 threads are `score_batch`'s, bit for
    /// bit: the lecture model's fixed-length rows, and the transformer's ragged ones with a
    /// group-wide term (Kimi's length reward) across the spans' boundaries.
    #[test]
    fn rewards_by_spans_are_the_batch_s() {
        let mut rng = SplitMix64::new(5);
        let mut ar = RunConfig::preset("transformer-sort").unwrap();
        ar.task.length_reward = LengthReward::Kimi;
        ar.task.format_reward = 0.5;
        for (c, g, prompts) in [(RunConfig::preset("scaled").unwrap(), 16, 70), (ar, 5, 301)] {
            let (n, v) = (c.task.n, c.task.vocab as u64);
            let eos = c.task.vocab as u32;
            let owned: Vec<Vec<u32>> = (0..prompts)
                .map(|_| (0..n).map(|_| rng.below(v) as u32).collect())
                .collect();
            let rows: Vec<Vec<u32>> = (0..prompts * g)
                .map(|i| {
                    let len = match c.model.kind {
                        crate::config::ModelKind::Transformer => 1 + rng.below(n as u64 + 1),
                        _ => n as u64,
                    } as usize;
                    let mut r: Vec<u32> = (0..len).map(|_| rng.below(v) as u32).collect();
                    if i % 3 == 0 && r.len() > n / 2 {
                        r.truncate(n / 2);
                        r.push(eos);
                    }
                    r
                })
                .collect();
            let ps: Vec<&[u32]> = owned.iter().map(|p| p.as_slice()).collect();
            let f = RewardFn::from_task(&c.task);
            let whole = score_batch(&f, &c, &ps, &rows, g);
            assert!(whole.0.iter().any(|&r| r != whole.0[0]), "rewards vary");
            for threads in [2, 3] {
                let got = score_on(&Cores::new(threads), &f, &c, &ps, &rows, g);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.0), bits(&whole.0), "{threads} threads");
                assert_eq!(got.1, whole.1, "{threads} threads");
            }
        }
    }
}
