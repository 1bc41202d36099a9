//! A GRPO run in progress: the config, the counters and the engine. `Trainer::step` (in
//! `iteration.rs`) performs one optimizer step; the first step of each iteration also rolls
//! out, verifies and freezes `π_old`. Nothing here blocks on anything but the engine and
//! nothing touches files, so the app drives it from a thread, a web build from its frame loop,
//! and `train` writes what it returns.

use super::prompts::PromptSampler;
use super::record::RolloutStats;
use super::replay::ReplayBuffer;
use crate::config::{ModelKind, RunConfig};
use crate::engine::{self, Batch, Engine, EngineError, Snapshot};
use crate::gpu::Compute;
use crate::metrics::GroupRecord;
use crate::objective::entropy_control::EntropyControl;
use crate::rng::SplitMix64;
use crate::task::sort::TaskError;
use crate::task::{PromptSet, RewardFn, accuracy};
use serde::{Deserialize, Serialize};
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
        /// The diverged step's record (its rollout's figures, the loss and norm that went
        /// non-finite): the run logs it, so what blew up first can be seen. None in the cold
        /// start.
        record: Option<Box<crate::metrics::StepRecord>>,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: String, reason: String },
    #[error("sft.teacher: {0}")]
    Teacher(String),
    #[error(
        "the run's config differs from the one its checkpoint was taken with, in {0}; a resumed run is the same run (only a longer run.iterations, and where it computes: run.device, run.engine, run.threads, may change): undo the edit, or start a new run with --out"
    )]
    ConfigChanged(String),
    #[error(
        "run.iterations = {asked} is below the {done} iterations the checkpoint has done: nothing would run; extend the run with a larger --set run.iterations=N"
    )]
    ShorterThanCheckpoint { asked: usize, done: usize },
}

impl TrainerState {
    /// Whether a run with `config` may continue from this state: not with fewer iterations
    /// than it has done (that would run nothing and call the run completed, its metrics past
    /// them kept), nor under a config that differs from the one it was taken with (a
    /// hand-edited `config.toml`) in more than where it computes.
    pub fn check_resume(&self, config: &RunConfig) -> Result<(), TrainError> {
        if config.run.iterations < self.iteration {
            return Err(TrainError::ShorterThanCheckpoint {
                asked: config.run.iterations,
                done: self.iteration,
            });
        }
        let Some(text) = &self.config_toml else {
            return Ok(());
        };
        let recorded = RunConfig::from_toml_str(text, "the checkpoint's config").map_err(|e| {
            TrainError::Checkpoint {
                path: "state.json".into(),
                reason: format!("its config does not parse: {e}"),
            }
        })?;
        let changed = recorded.changed_for_resume(config);
        if changed.is_empty() {
            Ok(())
        } else {
            Err(TrainError::ConfigChanged(changed.join(", ")))
        }
    }
}

impl TrainError {
    /// The device has not answered yet (a browser): the same step, asked again on a later
    /// frame, goes on where this one stopped.
    pub fn is_pending(&self) -> bool {
        matches!(self, TrainError::Engine(EngineError::Pending))
    }
}

/// Wall time spent in each part of the loop since the last reset (for `grpo-lab bench`).
/// On a wgpu device work is asynchronous: a part's time includes waiting for earlier work
/// at its first read-back.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Rollout: sampling, verifying (and advantages when the engine computes them with the
    /// samples), dynamic-sampling rounds included. On the fused CPU engines `log π_old` of the
    /// sampled tokens comes free with the sampling pass and is counted here, as is the greedy
    /// answer to each training prompt (the transformer's rides along as extra rows).
    pub rollout: f64,
    /// Advantages computed after the rollout (when not fused into it).
    pub advantages: f64,
    /// `log π_old` and `log π_ref` of the sampled tokens.
    pub old_ref_logp: f64,
    /// Greedy accuracy on the batch and the held-out prompts (metrics).
    pub evaluation: f64,
    /// The engine's whole optimizer step: forward, loss, backward, gradient clipping, Adam and
    /// the step's scalar read-back.
    pub step: f64,
}

/// The frozen data of one iteration: what its `μ` optimizer steps reuse.
pub(crate) struct Frozen {
    pub batch: Batch,
    /// The advantage mode that drives the update, `[B·G]`.
    pub advantages: Vec<f32>,
    /// `[B·G·T]`
    pub old_logp: Vec<f32>,
    pub ref_logp: Vec<f32>,
    pub stats: RolloutStats,
    pub groups: Option<Vec<GroupRecord>>,
    /// `[B·G·T]`: GAE's per-token advantages (`advantage = "gae"`).
    pub token_advantages: Option<Vec<f32>>,
    /// Per group: replaced by a stored group (`algorithm.replay_buffer`).
    pub replaced: Vec<bool>,
    /// `[B·G·T]` twice: each row's log π and entropy as its mini-batch's latest step read them
    /// (`algorithm.steps_per_generation` > 1), for the iteration's logged groups (the entropy
    /// empty where the engine returns none).
    pub seen: Option<(Vec<f32>, Vec<f32>)>,
    /// `[B·G·T]` the sampler's own log π, where it differs from the learner's (the mismatch
    /// lab).
    pub sampler_logp: Option<Vec<f32>>,
}

/// What a checkpoint holds besides the engine's state: the counters and the prompt sampler's
/// memory. Everything else is a function of (config, seed, iteration).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    pub iteration: usize,
    pub global_step: usize,
    #[serde(default)]
    pub last_reward_mean: Option<f32>,
    #[serde(default)]
    pub success: Vec<f32>,
    #[serde(default)]
    pub sft_heldout_accuracy: Option<f32>,
    /// Whether the supervised cold start had run (a checkpoint taken before it resumes by
    /// running it, from the same initial weights, exactly as an uninterrupted run does).
    #[serde(default = "yes")]
    pub sft_done: bool,
    /// The config the run had when the checkpoint was taken: a resume under another one
    /// (a hand-edited `config.toml`) is refused, except a longer `run.iterations`.
    #[serde(default)]
    pub config_toml: Option<String>,
    /// Responses sampled so far (for `run.rollout_budget`).
    #[serde(default)]
    pub rollouts: usize,
    /// PPO's critic (`advantage = "gae"`): parameters, Adam's moments and step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critic: Option<Vec<f32>>,
    /// The adaptive entropy coefficient's state (`algorithm.adaptive_entropy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy_control: Option<EntropyControl>,
    /// The replay buffer's groups (`algorithm.replay_buffer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayBuffer>,
}

fn yes() -> bool {
    true
}

/// The config fields a running trainer takes live (the app's **Apply**): the algorithm's
/// knobs, the optimizer, sampling, and the run's length. Everything else (task, model, seed,
/// device, cold start, logging) needs a new run.
pub const LIVE_SECTIONS: &[&str] = &["algorithm", "optimizer", "sampling", "run.iterations"];

/// A GRPO run in progress.
pub struct Trainer {
    pub config: RunConfig,
    pub prompts: PromptSet,
    pub reward_fn: RewardFn,
    pub(super) engine: Box<dyn Engine + Send>,
    pub(super) sampler: PromptSampler,
    /// The iteration in progress (or next to start).
    pub(super) iteration: usize,
    pub(super) step_in_iteration: usize,
    pub(super) global_step: usize,
    pub(super) frozen: Option<Frozen>,
    /// The rest of the iteration's optimizer steps, when the engine took them in one go
    /// (`Engine::batches_steps`), handed out one per `step`.
    pub(super) pending: std::collections::VecDeque<crate::engine::StepOutput>,
    /// This iteration's held-out evaluation while its whole-iteration submission is still on
    /// the device (a browser asks again on the next frame): `(iteration, accuracy, pass@k)`.
    pub(super) pre_eval: Option<(usize, Option<f32>, Option<super::record::PassAtK>)>,
    /// The cold start's last loss once its steps ran, while its held-out evaluation may still
    /// be on the device (a browser asks again, and the steps must not run twice).
    sft_loss: Option<f32>,
    /// The cold start's batches while its steps are on the device (a browser).
    sft_batches: Option<Vec<Batch>>,
    pub(super) last_reward_mean: f32,
    /// Responses sampled so far (dynamic sampling's redraws included).
    pub(super) rollouts: usize,
    /// PPO's critic (`advantage = "gae"`), made at its first use.
    pub(super) critic: Option<crate::objective::value::ValueModel>,
    /// The entropy bonus's coefficient from step to step (fixed, or adaptive).
    pub(super) entropy_control: EntropyControl,
    /// Groups with a reward signal kept for replay (`algorithm.replay_buffer`).
    pub(super) replay: ReplayBuffer,
    /// The engine's state at the start of the last `max_staleness + 1` iterations, oldest
    /// first: the stale samplers (`grpo::staleness`).
    pub(super) stale: std::collections::VecDeque<crate::engine::Snapshot>,
    /// The supervised cold start has run (or there is none).
    sft_done: bool,
    sft_heldout_accuracy: Option<f32>,
    pub(super) timings: Timings,
}

impl Trainer {
    /// A run of `config` on the fastest engine for it on `compute` (see `engine::kind_for`).
    pub fn new(config: RunConfig, compute: Compute) -> Result<Self, TrainError> {
        let engine = engine::build(&config, &compute)?;
        Self::with_engine(config, engine)
    }

    /// A run of `config` on a given engine.
    pub fn with_engine(
        config: RunConfig,
        engine: Box<dyn Engine + Send>,
    ) -> Result<Self, TrainError> {
        let prompts = PromptSet::build(&config.task, config.run.seed)?;
        let entropy_control = EntropyControl::start(&config.algorithm);
        Ok(Self {
            reward_fn: RewardFn::from_task(&config.task),
            sampler: PromptSampler::new(&prompts.train),
            sft_done: config.sft.steps == 0,
            sft_heldout_accuracy: None,
            timings: Timings::default(),
            config,
            prompts,
            engine,
            iteration: 0,
            step_in_iteration: 0,
            global_step: 0,
            frozen: None,
            pending: Default::default(),
            pre_eval: None,
            sft_loss: None,
            sft_batches: None,
            last_reward_mean: f32::NAN,
            rollouts: 0,
            critic: None,
            entropy_control,
            replay: ReplayBuffer::default(),
            stale: Default::default(),
        })
    }

    pub fn iteration(&self) -> usize {
        self.iteration
    }
    pub fn global_step(&self) -> usize {
        self.global_step
    }
    /// Optimizer steps left in the iteration in progress (μ·steps_per_generation at a
    /// boundary).
    pub fn steps_left_in_iteration(&self) -> usize {
        self.config
            .algorithm
            .steps_per_iteration()
            .saturating_sub(self.step_in_iteration)
            .max(1)
    }
    /// The run has done `run.iterations`, or spent `run.rollout_budget` at an iteration's end.
    pub fn is_done(&self) -> bool {
        let budget = self.config.run.rollout_budget;
        self.iteration >= self.config.run.iterations
            || (budget > 0 && self.rollouts >= budget && self.at_iteration_boundary())
    }
    /// Responses sampled so far.
    pub fn rollouts(&self) -> usize {
        self.rollouts
    }
    /// A fresh critic for this config (PPO's value model, `advantage = "gae"`).
    pub(super) fn new_critic(&self) -> crate::objective::value::ValueModel {
        let c = &self.config;
        crate::objective::value::ValueModel::new(
            c.task.n,
            c.task.vocab,
            c.max_len(),
            c.algorithm.value_hidden,
            c.run.seed,
        )
    }
    /// The critic's trainable parameters (0 without one).
    pub fn critic_parameters(&self) -> usize {
        self.critic.as_ref().map_or(0, |c| c.parameters())
    }
    /// True between iterations: the only points where checkpoints are taken.
    pub fn at_iteration_boundary(&self) -> bool {
        self.step_in_iteration == 0 && self.frozen.is_none()
    }
    pub fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }
    /// The engine itself (the gradient lab asks it for the reference's log π).
    pub fn engine_mut(&mut self) -> &mut dyn Engine {
        self.engine.as_mut()
    }
    /// What computes, where (one line).
    pub fn engine_label(&self) -> String {
        self.engine.label()
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
    pub(super) fn is_autoregressive(&self) -> bool {
        self.config.model.kind == ModelKind::Transformer
    }
    /// `<eos>` of the transformer's vocabulary (one past the numbers); the padding token.
    pub(super) fn eos(&self) -> u32 {
        self.config.task.vocab as u32
    }

    /// Take a config changed live: only the fields of [`LIVE_SECTIONS`] move; the rest stays
    /// as the run started. Returns the keys of the other sections that differ (ignored).
    pub fn apply_live(&mut self, new: &RunConfig) -> Vec<&'static str> {
        let mut c = self.config.clone();
        c.algorithm = new.algorithm.clone();
        c.optimizer = new.optimizer.clone();
        c.sampling = new.sampling.clone();
        c.run.iterations = new.run.iterations;
        c.run.entropy_dynamics = new.run.entropy_dynamics;
        let ignored = Self::needs_reset(&self.config, new);
        self.config = c;
        ignored
    }

    /// The sections of `new` that differ from `old` and need a new run to take effect.
    pub fn needs_reset(old: &RunConfig, new: &RunConfig) -> Vec<&'static str> {
        let mut out = Vec::new();
        if old.task != new.task {
            out.push("task");
        }
        if old.model != new.model {
            out.push("model");
        }
        if old.sft != new.sft {
            out.push("sft");
        }
        // The run's length and what it logs move live.
        let (mut a, mut b) = (old.run.clone(), new.run.clone());
        (a.iterations, a.entropy_dynamics) = (0, false);
        (b.iterations, b.entropy_dynamics) = (0, false);
        if a != b {
            out.push("run");
        }
        out
    }

    /// Move to an engine that computes what the (live-changed) config asks, keeping the
    /// weights and the reference.
    pub(super) fn ensure_engine_supports_config(&mut self) -> Result<(), TrainError> {
        if !self.engine.supports(&self.config) {
            let snapshot = self.engine.snapshot()?;
            let burn = engine::covering_all_from(&self.config, &snapshot)?;
            log::info!(
                "the config now asks for something {} does not cover: continuing on {}",
                self.engine.label(),
                burn.label()
            );
            self.engine = burn;
        }
        Ok(())
    }

    /// Steps until `budget_secs` of wall time have passed (at least one step, at most
    /// `max_steps`, none once the run is done): the form a single-threaded frame loop (the
    /// browser's) drives, a time budget per frame so the page stays responsive.
    pub fn run_for(
        &mut self,
        budget_secs: f64,
        max_steps: usize,
    ) -> Result<Vec<crate::metrics::StepRecord>, TrainError> {
        let started = web_time::Instant::now();
        let mut out = Vec::new();
        while !self.is_done()
            && out.len() < max_steps
            && (out.is_empty() || started.elapsed().as_secs_f64() < budget_secs)
        {
            out.push(self.step()?);
        }
        Ok(out)
    }

    /// `(train, held-out)` greedy accuracy.
    pub fn evaluate(&mut self) -> Result<(f32, Option<f32>), TrainError> {
        fn slices(v: &[Vec<u32>]) -> Vec<&[u32]> {
            v.iter().map(|p| p.as_slice()).collect()
        }
        let train = slices(&self.prompts.train);
        let acc_train = greedy_accuracy(self.engine.as_mut(), &self.config, &train)?;
        Ok((acc_train, self.heldout_accuracy()?))
    }

    /// Greedy accuracy on the held-out prompts (None without any).
    pub(super) fn heldout_accuracy(&mut self) -> Result<Option<f32>, TrainError> {
        let heldout: Vec<&[u32]> = self.prompts.heldout.iter().map(|p| p.as_slice()).collect();
        if heldout.is_empty() {
            return Ok(None);
        }
        greedy_accuracy(self.engine.as_mut(), &self.config, &heldout).map(Some)
    }

    /// Whether the cold start is behind (or not asked for): the next iteration begins without it.
    pub fn cold_start_done(&self) -> bool {
        self.sft_done
    }

    /// The supervised cold start (DeepSeek-R1's recipe): `sft.steps` Adam steps of
    /// cross-entropy on (prompt, sorted) pairs from the training prompts, `<eos>` included for
    /// the transformer. The reference then starts from the fine-tuned policy, as in R1.
    pub fn cold_start(&mut self) -> Result<(), TrainError> {
        if self.sft_done {
            return Ok(());
        }
        let s = self.config.sft.clone();
        let last_loss = match self.sft_loss {
            Some(loss) => loss,
            None => {
                let loss = self.supervised_steps(&s)?;
                self.sft_loss = Some(loss);
                loss
            }
        };
        self.engine.refresh_reference();
        self.sft_heldout_accuracy = self.heldout_accuracy()?;
        self.sft_done = true;
        log::info!(
            "cold start: {} supervised steps, final loss {last_loss:.4}, held-out accuracy {:?}",
            s.steps,
            self.sft_heldout_accuracy
        );
        Ok(())
    }

    /// The cold start's supervised steps on the engine; their last loss (finite).
    fn supervised_steps(&mut self, s: &crate::config::SftConfig) -> Result<f32, TrainError> {
        let batches = match self.sft_batches.take() {
            Some(b) => b,
            None => self.sft_batches(s)?,
        };
        let last_loss = match self.engine.supervised(&batches, s.lr) {
            Err(EngineError::Pending) => {
                self.sft_batches = Some(batches);
                return Err(EngineError::Pending.into());
            }
            other => other?,
        };
        if !last_loss.is_finite() {
            return Err(TrainError::NonFinite {
                step: 0,
                iteration: 0,
                value: last_loss,
                record: None,
            });
        }
        Ok(last_loss)
    }

    /// The cold start's batches: `sft.steps` batches of (prompt, sorted or the teacher's
    /// answer) pairs.
    fn sft_batches(&self, s: &crate::config::SftConfig) -> Result<Vec<Batch>, TrainError> {
        let mut order: Vec<usize> = (0..self.prompts.train.len()).collect();
        SplitMix64::for_stream(self.config.run.seed, "sft").shuffle(&mut order);
        order.truncate(s.examples.max(1));
        let (eos, ar, n) = (self.eos(), self.is_autoregressive(), self.config.task.n);
        // Distillation: a trained teacher's sampled answer to each example, right or wrong.
        let taught = if s.teacher == "none" {
            None
        } else {
            Some(self.teacher_answers(&order)?)
        };
        let batches: Vec<Batch> = (0..s.steps)
            .map(|step| {
                let slots: Vec<usize> = (0..s.batch_size)
                    .map(|j| (step * s.batch_size + j) % order.len())
                    .collect();
                let picked: Vec<&Vec<u32>> = slots
                    .iter()
                    .map(|&k| &self.prompts.train[order[k]])
                    .collect();
                let targets: Vec<Vec<u32>> = picked
                    .iter()
                    .zip(&slots)
                    .map(|(p, &k)| {
                        if let Some(answers) = &taught {
                            return answers[k].clone();
                        }
                        let mut t = crate::task::sort::sorted(p);
                        if ar {
                            t.push(eos);
                        }
                        t
                    })
                    .collect();
                let prompts = picked.iter().flat_map(|p| p.iter().copied()).collect();
                Batch::padded(prompts, n, &targets, 1, eos)
            })
            .collect();
        Ok(batches)
    }

    /// `sft.teacher`: train the teacher preset (this run's seed, the CPU engines) to its end,
    /// then sample one answer from it to each of the training prompts `examples`.
    fn teacher_answers(&self, examples: &[usize]) -> Result<Vec<Vec<u32>>, TrainError> {
        let name = &self.config.sft.teacher;
        let mut cfg = RunConfig::preset(name).map_err(|e| TrainError::Teacher(e.to_string()))?;
        cfg.run.seed = self.config.run.seed;
        cfg.run.device = crate::config::DeviceChoice::Cpu;
        cfg.run.log_groups = 0;
        cfg.run.eval_every = 0;
        let compute = crate::gpu::Compute::select(crate::config::DeviceChoice::Cpu)
            .map_err(|e| TrainError::Teacher(e.to_string()))?;
        let mut teacher = Trainer::new(cfg, compute)?;
        while !teacher.is_done() {
            teacher.step()?;
        }
        let prompts: Vec<&[u32]> = examples
            .iter()
            .map(|&i| self.prompts.train[i].as_slice())
            .collect();
        let tc = &teacher.config;
        let samples = teacher.engine.sample(&crate::engine::SampleRequest {
            prompts: &prompts,
            g: 1,
            max_len: tc.max_len(),
            params: crate::objective::sampling::SamplingParams::of(&tc.sampling),
            seed: tc.run.seed,
            stream: crate::rng::counter_u32(tc.run.seed, &[0x7EAC]),
            sampler: crate::engine::SamplerSide::default(),
            verify: None,
        })?;
        let right = accuracy(&self.config, &prompts, &samples.rows);
        log::info!(
            "teacher {name}: trained {} iterations; {:.1} % of its {} sampled answers are right",
            teacher.iteration(),
            100.0 * right,
            samples.rows.len()
        );
        Ok(samples.rows)
    }

    /// The run's state between iterations: counters and the engine's weights, reference and
    /// optimizer state. `train` writes it as a checkpoint.
    pub fn snapshot(&self) -> Result<(TrainerState, Snapshot), TrainError> {
        assert!(
            self.at_iteration_boundary(),
            "checkpoints are taken between iterations"
        );
        let state = TrainerState {
            iteration: self.iteration,
            global_step: self.global_step,
            last_reward_mean: Some(self.last_reward_mean).filter(|x| x.is_finite()),
            success: self.sampler.success.clone(),
            sft_heldout_accuracy: self.sft_heldout_accuracy,
            sft_done: self.sft_done,
            config_toml: Some(self.config.to_toml()),
            rollouts: self.rollouts,
            critic: self.critic.as_ref().map(|c| c.state()),
            entropy_control: self
                .config
                .algorithm
                .adaptive_entropy
                .then_some(self.entropy_control),
            replay: (self.config.algorithm.replay_buffer > 0).then(|| self.replay.clone()),
        };
        let mut blobs = self.engine.snapshot()?;
        blobs.extend(self.stale_blobs());
        Ok((state, blobs))
    }

    /// Continue from what `snapshot` returned; the run then continues bit-identically.
    pub fn restore(&mut self, state: TrainerState, snapshot: &Snapshot) -> Result<(), TrainError> {
        state.check_resume(&self.config)?;
        let snapshot = &self.restore_stale(snapshot);
        match self.engine.restore(snapshot) {
            // Written on burn's path (a GPU, or `run.fused_step = off` at the time): it
            // continues there, on the CPU backend, with burn's own Adam state, as it began.
            Err(EngineError::WrittenByBurn) => {
                self.engine = engine::covering_all_from(&self.config, snapshot)?;
                log::info!(
                    "the checkpoint was written on burn's path: continuing on {}",
                    self.engine.label()
                );
            }
            other => other?,
        }
        self.iteration = state.iteration;
        self.global_step = state.global_step;
        self.rollouts = state.rollouts;
        if let Some(control) = state.entropy_control {
            self.entropy_control = control;
        }
        if let Some(replay) = state.replay {
            self.replay = replay;
        }
        self.critic = match &state.critic {
            Some(s) => {
                let mut critic = self.new_critic();
                if !critic.set_state(s) {
                    return Err(TrainError::Checkpoint {
                        path: "state.json".into(),
                        reason: format!(
                            "its critic has {} numbers, this config's {}",
                            s.len(),
                            critic.state().len()
                        ),
                    });
                }
                Some(critic)
            }
            None => None,
        };
        self.last_reward_mean = state.last_reward_mean.unwrap_or(f32::NAN);
        if state.success.len() == self.sampler.success.len() {
            self.sampler.success = state.success;
        }
        self.sft_heldout_accuracy = state.sft_heldout_accuracy;
        self.sft_done = state.sft_done || self.config.sft.steps == 0;
        self.step_in_iteration = 0;
        self.frozen = None;
        self.pending.clear();
        Ok(())
    }
}

/// Greedy exact-match accuracy of an engine's current policy on some prompts.
pub(super) fn greedy_accuracy(
    engine: &mut (dyn Engine + Send),
    config: &RunConfig,
    prompts: &[&[u32]],
) -> Result<f32, TrainError> {
    let answers = engine.greedy(prompts, config.max_len())?;
    Ok(accuracy(config, prompts, &answers))
}
